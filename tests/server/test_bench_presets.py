"""`dflash bench` prompt presets and throughput at fixed interactivity, on synthetic rows; no
server."""

import json
import math

import pytest

from dflash_cli.commands import bench as bench_command
from dflash_cli.main import build_parser
from dflash_cli.serving import bench
from dflash_plugin.errors import DFlashError


def bench_args(*argv):
    return build_parser().parse_args(["bench", *argv])


def row(algorithm, concurrency, tokens_per_s, tpot_ms, failed=0):
    return {"algorithm": algorithm, "concurrency": concurrency,
            "output_tokens_per_s": tokens_per_s, "tpot_ms": tpot_ms, "failed": failed}


SWEEP = [
    row("none", 1, 40.0, 25.0), row("none", 4, 120.0, 33.0), row("none", 16, 200.0, 80.0),
    row("ngram", 1, 52.0, 19.0), row("ngram", 4, 130.0, 30.0), row("ngram", 16, 210.0, 75.0),
    # faster at 16 but over the bound: does not count; at 4 it has a failed request
    row("dflash", 1, 60.0, 16.0), row("dflash", 4, 170.0, 22.0, failed=1),
    row("dflash", 16, 400.0, 38.0),
]


def test_fixed_interactivity_picks_the_best_level_within_the_bound():
    summary = bench.fixed_interactivity(SWEEP, 1.5)
    assert summary["reference_tpot_ms"] == 25.0 and summary["tpot_limit_ms"] == 37.5
    best = summary["algorithms"]
    assert best["none"]["concurrency"] == 4 and best["none"]["output_tokens_per_s"] == 120.0
    assert best["ngram"]["concurrency"] == 4 and best["ngram"]["speedup"] == round(130 / 120, 3)
    # 16 is over 37.5 ms and 4 failed a request: concurrency 1 is dflash's best within the bound
    assert best["dflash"]["concurrency"] == 1 and best["dflash"]["speedup"] == 0.5
    # a looser bound admits dflash at 16
    loose = bench.fixed_interactivity(SWEEP, 1.6)["algorithms"]
    assert loose["dflash"]["concurrency"] == 16 and loose["dflash"]["speedup"] == round(400 / 120, 3)
    assert loose["none"]["concurrency"] == 4


def test_fixed_interactivity_bound_below_plain_and_missing_reference():
    tight = bench.fixed_interactivity(SWEEP, 0.7)  # 17.5 ms: only dflash at 1 qualifies
    assert tight["algorithms"]["none"] is None and tight["algorithms"]["ngram"] is None
    assert tight["algorithms"]["dflash"]["concurrency"] == 1
    assert tight["algorithms"]["dflash"]["speedup"] is None  # nothing to compare with
    text = bench.format_fixed_interactivity(tight)
    assert "no level within the bound" in text and "17.5 ms" in text
    without_plain = bench.fixed_interactivity([r for r in SWEEP if r["algorithm"] != "none"], 1.5)
    assert without_plain["algorithms"] == {} and "'none' row" in without_plain["unavailable"]
    assert "'none' row" in bench.format_fixed_interactivity(without_plain)


def test_json_carries_rows_prompts_and_fixed_interactivity(tmp_path):
    args = bench_args("--tpot-bound", "1.5", "--prompts", "ood")
    about = {"set": "ood", "file": "x", "categories": None, "count": 96}
    extra = bench_command.summaries(SWEEP, args, about)
    bench.write_json(SWEEP, tmp_path / "out.json", **extra)
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["rows"] == SWEEP and written["prompts"] == about
    assert written["fixed_interactivity"]["algorithms"]["ngram"]["concurrency"] == 4
    assert "ngram" in bench.format_fixed_interactivity(written["fixed_interactivity"])


def test_prompt_presets_read_the_repository_sets():
    ood, about = bench_command.read_prompts(bench_args("--prompts", "ood"))
    records = [json.loads(line) for line in open(bench.prompt_set_path("ood"))]
    assert ood == [r["text"] for r in records] and about["count"] == len(records) == 96
    picked, about = bench_command.read_prompts(
        bench_args("--prompts", "ood", "--prompt-categories", "extraction,coding"))
    assert picked == [r["text"] for r in records if r["category"] in ("extraction", "coding")]
    assert about["categories"] == ["extraction", "coding"] and len(picked) == 24
    builtin, about = bench_command.read_prompts(bench_args())
    assert builtin == bench.read_prompts(None) and about["set"] == "builtin"
    if (bench.REPO_ROOT / bench.PROMPT_SETS["heldout"]).is_file():
        heldout, _ = bench_command.read_prompts(bench_args("--prompts", "heldout"))
        assert len(heldout) == 18


def test_prompt_presets_fail_clearly(tmp_path):
    # an installed package: no train_data/ next to it
    with pytest.raises(DFlashError, match="installed package.*--prompts-file"):
        bench.prompt_set_path("ood", root=tmp_path)
    with pytest.raises(DFlashError, match="no prompt in categories poetry"):
        bench_command.read_prompts(bench_args("--prompts", "ood", "--prompt-categories", "poetry"))
    with pytest.raises(SystemExit):  # one prompt source at a time
        bench_args("--prompts", "ood", "--prompts-file", "x.jsonl")
    with pytest.raises(SystemExit):
        bench_args("--prompts", "nonesuch")
    for bound in ("0", "-1", "nan"):
        with pytest.raises(DFlashError, match="--tpot-bound"):
            bench_command._check(bench_args("--tpot-bound", bound))
    assert math.isclose(bench_args().tpot_bound, 1.5)


def test_fewer_requests_than_prompts_spread_over_the_categories():
    ood = bench.read_prompts(bench.prompt_set_path("ood"))
    categories = {r["text"]: r["category"] for r in map(json.loads, open(
        bench.prompt_set_path("ood")))}
    picked = bench_command._prompts_for(ood, 32)
    assert len(set(picked)) == 32
    counts = {}
    for prompt in picked:
        counts[categories[prompt]] = counts.get(categories[prompt], 0) + 1
    assert sorted(counts.values()) == [4] * 8
    assert bench_command._prompts_for(["a", "b"], 5) == ["a", "b", "a", "b", "a"]


def test_restarts_pool_every_start_of_every_server(tmp_path, monkeypatch):
    """--sequential --restarts 3: each server starts three times, in turn, and each row pools
    its runs over all three starts (fake servers and runs: no engine)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    starts = []

    @contextmanager
    def started(algorithm, opts, args, output):
        starts.append(algorithm)
        yield SimpleNamespace(base_url=f"http://{algorithm}"), "model"

    def measure(base_url, model, prompts, concurrency, args, repeats):
        # The n-th start of a server runs n times as fast: pooling must see every start.
        speed = starts.count(base_url.removeprefix("http://"))
        results = [bench.RequestResult(ok=True, latency_s=1.0, ttft_s=0.1, output_tokens=10)
                   for _ in range(concurrency * repeats)]
        return bench_command._Sample(results, [concurrency * 10 / (10 * speed)] * repeats,
                                     dict.fromkeys(bench.SPEC_COUNTERS, 0.0))

    monkeypatch.setattr(bench_command, "_started", started)
    primed = []
    monkeypatch.setattr(bench_command, "_prime", lambda url, model, p, level, a: primed.append(
        (url.removeprefix("http://"), level)))
    monkeypatch.setattr(bench_command, "_measure", measure)
    args = bench_args("--algorithms", "none,ngram", "--concurrency", "1,4", "--sequential",
                      "--restarts", "3", "--repeats", "2", "--output", str(tmp_path / "b.json"))
    variants, levels = bench_command._check(args)
    rows, broken = bench_command._run_sequential(list(variants), dict.fromkeys(variants), [
        "p"], levels, args, tmp_path / "b.json", {})
    assert starts == ["none", "ngram"] * 3 and not broken
    assert primed == [("none", 1), ("none", 4), ("ngram", 1), ("ngram", 4)] * 3  # before each
    assert [(r["algorithm"], r["concurrency"]) for r in rows] == [
        ("none", 1), ("none", 4), ("ngram", 1), ("ngram", 4)]
    for r in rows:
        assert r["restarts"] == 3 and r["repeats"] == 6
        # 10, 20 and 30 tokens/s, two runs each: every start is in the pool
        assert r["output_tokens_per_s_runs"] == [10.0, 10.0, 20.0, 20.0, 30.0, 30.0]
        assert "num_drafts_runs" not in r  # a start's runs share one counter reading
    saved = json.loads((tmp_path / "b.json").read_text())
    assert [r["restarts"] for r in saved["rows"]] == [3] * 4


def test_interleaved_restarts_alternate_and_pool_every_start(tmp_path, monkeypatch):
    """Without --sequential: all servers up together, runs alternating in ABBA order at each
    level, every server started --restarts times, each row pooling all its runs."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    events = []

    @contextmanager
    def started(algorithm, opts, args, output):
        events.append(("start", algorithm))
        yield SimpleNamespace(base_url=f"http://{algorithm}"), "model"
        events.append(("stop", algorithm))

    def measure(base_url, model, prompts, concurrency, args, repeats):
        name = base_url.removeprefix("http://")
        events.append(("run", name, concurrency))
        speed = sum(e == ("start", name) for e in events)  # the n-th start runs n times as fast
        results = [bench.RequestResult(ok=True, latency_s=1.0, ttft_s=0.1, output_tokens=10)
                   for _ in range(concurrency)]
        counted = dict.fromkeys(bench.SPEC_COUNTERS, 0.0)
        counted["vllm:spec_decode_num_drafts"] = 7.0 * speed
        return bench_command._Sample(results, [concurrency / speed], counted)

    def prime(base_url, model, prompts, concurrency, args):
        events.append(("prime", base_url.removeprefix("http://"), concurrency))

    monkeypatch.setattr(bench_command, "_started", started)
    monkeypatch.setattr(bench_command, "_prime", prime)
    monkeypatch.setattr(bench_command, "_measure", measure)
    args = bench_args("--algorithms", "none,ngram", "--concurrency", "1,4", "--restarts", "2",
                      "--repeats", "2", "--output", str(tmp_path / "b.json"))
    variants, levels = bench_command._check(args)
    rows, broken = bench_command._run_interleaved(list(variants), dict.fromkeys(variants), ["p"],
                                                  levels, args, tmp_path / "b.json", {})
    assert not broken
    one_start = [("start", "none"), ("start", "ngram")]
    for level in (1, 4):
        for name in ("none", "ngram", "ngram", "none"):  # ABBA, each run after its own burst
            one_start += [("prime", name, level), ("run", name, level)]
    one_start += [("stop", "ngram"), ("stop", "none")]
    assert events == one_start * 2
    assert [(r["algorithm"], r["concurrency"]) for r in rows] == [
        ("none", 1), ("ngram", 1), ("none", 4), ("ngram", 4)]
    for r in rows:
        assert r["restarts"] == 2 and r["repeats"] == 4
        assert r["output_tokens_per_s_runs"] == [10.0, 10.0, 20.0, 20.0]  # both starts pooled
        # each run's own drafts beside its rate (no speculation counts none)
        assert r.get("num_drafts_runs") == (None if r["algorithm"] == "none" else [7, 7, 14, 14])
    saved = json.loads((tmp_path / "b.json").read_text())
    assert [r["restarts"] for r in saved["rows"]] == [2] * 4


def test_restarts_need_a_positive_count():
    with pytest.raises(DFlashError, match="--restarts must be >= 1"):
        bench_command._check(bench_args("--restarts", "0", "--sequential"))
    assert bench_command._check(bench_args("--restarts", "2"))[1] == [1, 4, 16, 32]


def test_prime_is_a_short_burst_at_the_level(monkeypatch):
    """The unmeasured burst before a run: the level's requests all in flight, few tokens each,
    never more than the measured run asks for."""
    calls = []

    async def run_point(base_url, model, prompts, concurrency, **options):
        calls.append((base_url, len(prompts), concurrency, options["max_tokens"]))
        return [], 0.0

    monkeypatch.setattr(bench, "run_point", run_point)
    prompts = [f"p{i}" for i in range(8)]
    for max_tokens in ("128", "8"):
        args = bench_args("--max-tokens", max_tokens)
        bench_command._prime("http://x", "model", prompts, 4, args)
    assert calls == [("http://x", 4, 4, bench_command.PRIME_TOKENS), ("http://x", 4, 4, 8)]
