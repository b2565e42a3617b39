"""Benchmark speculative decoding through the OpenAI API, side by side on the same prompts:
no speculation (none), vLLM's n-gram prompt lookup (ngram), vLLM's native DFlash with this
project's plugin switched off (dflash-native: VLLM_PLUGINS without "dflash"), and DFlash with the
plugin (dflash). Each configuration gets one vLLM server on 127.0.0.1. By default all servers are
up at once (an idle server uses almost no CPU) and, at each concurrency level, their runs
alternate, so that a machine whose speed drifts (shared hosts, thermal limits) slows every
configuration alike; `--sequential` runs one server at a time instead (a quarter of the memory).
Every measured run follows an unmeasured burst on its own server: a server is slower in its
first run after others ran, which would favour the rows that happen to run twice in a row.

Writes to --output a JSON object: "rows", one per algorithm and level (algorithm, concurrency,
output_tokens_per_s, tpot_ms, ttft_ms, accept_length, speedup, ...), "prompts" (the set it ran)
and "fixed_interactivity" (per algorithm, the best tokens/s over the levels whose TPOT stays
within --tpot-bound times plain decoding's at concurrency 1: throughput at fixed interactivity,
the serving measure the DFlash authors report). It plots <stem>_throughput.png and
<stem>_speedup.png next to it, and writes each server's log as <stem>.<algorithm>.log.
`--prompts ood` runs the out-of-distribution evaluation set of the repository checkout
(train_data/eval/). The model flags are those of `dflash serve` (including --config and
pass-through engine arguments).

A plugin row can carry its own DFLASH_* settings, to compare them side by side in one run:
`--algorithms 'none,dflash,dflash[DFLASH_DRAFT_POLICY=off;DFLASH_DEFER_CONTEXT=off]'` starts one plugin
server per variant; its rows are named as written. A DFlash row (plugin or native) can also name
its own drafter, to compare two checkpoints in one run: `dflash[draft=/path/to/other/drafter]`,
and its own block, `dflash[draft_tokens=8]` (as --speculative-num-draft-tokens).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path

from dflash_cli.serving import bench, flags
from dflash_cli.serving.server import Server, ServerExited, free_port
from dflash_plugin import switches
from dflash_plugin.errors import DFlashError

HELP = "benchmark none / ngram / native DFlash / plugin DFlash servers over concurrency levels"
PLUGIN_NAME = flags.VLLM_PLUGIN_NAME
SPEC_ALGORITHM = {"none": "NONE", "ngram": "NGRAM", "dflash-native": "DFLASH", "dflash": "DFLASH"}
# "dflash[NAME=VALUE;NAME=VALUE]": the plugin with its own settings (DFLASH_* variables,
# draft=PATH for the drafter, draft_tokens=N for --speculative-num-draft-tokens);
# "dflash-native[draft=PATH;draft_tokens=N]": vLLM's DFlash with another drafter or block.
_VARIANT = re.compile(r"(?P<base>[\w-]+)(?:\[(?P<settings>[^\]]*)\])?")
# Settings of the server process, which every row may take (e.g. 'none[DFLASH_CPU_PRELOAD=off]');
# the arena cache is in every process that loads the plugin, plain and n-gram rows included
SERVER_SETTINGS = frozenset({"DFLASH_CPU_PRELOAD", "DFLASH_CPU_CORES", "DFLASH_ARENA_CACHE"})
PRIME_TOKENS = 32  # tokens per request of the unmeasured burst before each run
_SETTING = re.compile(r"(DFLASH_[A-Z0-9_]+|draft_tokens|draft)=(.*)")


@dataclass(frozen=True)
class Variant:
    """One --algorithms entry: the configuration, its DFLASH_* variables, its own drafter."""

    base: str
    env: dict[str, str] = field(default_factory=dict)
    draft: str | None = None  # None: the drafter of --speculative-draft-model-path / the default
    draft_tokens: int | None = None  # None: --speculative-num-draft-tokens / the checkpoint's


def _file_safe(text: str) -> str:
    return re.sub(r"[^\w.=-]+", "_", text)


def parse_algorithm(text: str) -> Variant:
    """'dflash[DFLASH_DRAFT_POLICY=off;draft=/d]' -> Variant('dflash', {'DFLASH_DRAFT_POLICY': 'off'},
    '/d')."""
    match = _VARIANT.fullmatch(text)
    base = match["base"] if match else None
    if base not in bench.ALGORITHMS:
        raise DFlashError(f"unknown --algorithms entry {text!r}; choose from "
                          f"{', '.join(bench.ALGORITHMS)}, or dflash[DFLASH_NAME=value;...]")
    if match["settings"] is None:
        return Variant(base)
    dflash_row = SPEC_ALGORITHM[base] == "DFLASH"
    env, draft, draft_tokens = {}, None, None
    for item in filter(None, (part.strip() for part in match["settings"].split(";"))):
        setting = _SETTING.fullmatch(item)
        if not dflash_row and (setting is None or setting[1] not in SERVER_SETTINGS):
            raise DFlashError(f"--algorithms {text!r}: only the DFlash rows (dflash[...], "
                              "dflash-native[draft=...]) take settings other than "
                              f"{', '.join(sorted(SERVER_SETTINGS))}")
        if setting is None:
            raise DFlashError(f"--algorithms {text!r}: {item!r} is not DFLASH_NAME=value, "
                              "draft=PATH or draft_tokens=N")
        if setting[1] == "draft":
            draft = setting[2].strip()
        elif setting[1] == "draft_tokens":
            draft_tokens = _positive_int(setting[2], text)
        elif base != "dflash" and setting[1] not in SERVER_SETTINGS:
            # the plugin's variables mean nothing to vLLM's own DFlash
            raise DFlashError(f"--algorithms {text!r}: only the plugin's rows take DFLASH_* "
                              "settings")
        elif setting[1] not in switches.BY_NAME:
            raise DFlashError(f"--algorithms {text!r}: {setting[1]} is not one of the plugin's "
                              "environment switches (see the README's table)")
        else:
            env[setting[1]] = setting[2]
    if draft == "":
        raise DFlashError(f"--algorithms {text!r}: draft= needs a drafter path")
    return Variant(base, env, draft, draft_tokens)


def _positive_int(value: str, entry: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number < 2:  # one token per verify block would be plain decoding
        raise DFlashError(f"--algorithms {entry!r}: draft_tokens={value!r} must be an integer "
                          ">= 2 (tokens per verify block, as --speculative-num-draft-tokens)")
    return number


def add_arguments(p):
    p.add_argument("--algorithms", default=",".join(bench.ALGORITHMS),
                   help=f"comma list from {', '.join(bench.ALGORITHMS)}; a plugin row may set "
                        "its own DFLASH_* variables: 'dflash[DFLASH_DRAFT_POLICY=off;...]', and a "
                        "DFlash row its own drafter and block: 'dflash[draft=PATH;draft_tokens=8]'")
    p.add_argument("--concurrency", default="1,4,16,32", help="comma list of concurrency levels")
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument("--prompts", choices=tuple(bench.PROMPT_SETS), default=None,
                         help="a prompt set: builtin (32 short prompts, the default), ood (the "
                              "96 hand-written out-of-distribution user prompts of "
                              "train_data/eval/), heldout (the 18 held-out prompts of "
                              "train_data/smollm2-135m/); ood and heldout need the repository "
                              "checkout")
    prompts.add_argument("--prompts-file", help='JSONL with {"prompt": ...} (or "text", or '
                                                '"turns") per line')
    p.add_argument("--prompt-categories", default=None,
                   help="comma list: only the prompts whose \"category\" field is one of these "
                        "(e.g. --prompts ood --prompt-categories extraction,coding)")
    p.add_argument("--tpot-bound", type=float, default=1.5,
                   help="throughput at fixed interactivity: per algorithm, the best tokens/s over "
                        "the levels whose TPOT is at most this times plain decoding's ('none') "
                        "TPOT at concurrency 1 (default 1.5)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="requests per concurrency level, at least the concurrency (default: all "
                        "prompts; fewer are spread evenly over the file, more repeat it)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per concurrency level against the same server, pooled into one row "
                        "(total tokens over total time; each run's tokens/s is kept too): on a "
                        "shared or small machine one short run can be off by several percent")
    p.add_argument("--sequential", action="store_true",
                   help="one server at a time, each sweeping every level (less memory; runs of "
                        "different configurations then happen minutes apart)")
    p.add_argument("--restarts", type=int, default=1,
                   help="start every server this many times (all together, or in turn with "
                        "--sequential) and pool each row's runs over all of them (on a small VM "
                        "two instances of one server can differ by several percent; default 1)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true",
                   help="always generate --max-tokens tokens")
    p.add_argument("--output", default="dflash-bench.json", help="results JSON (plots and server "
                                                                 "logs go next to it)")
    p.add_argument("--server-timeout", type=float, default=1200.0,
                   help="seconds to wait for each server to start (the first start compiles)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    # The model flags of `dflash serve`; the algorithm, engine and address are set per row.
    flags.add_flag_arguments(p, exclude=("engine", "speculative_algorithm", "host", "port"))
    flags.accept_engine_args(p)


def plugin_env(algorithm: str, environ=os.environ) -> dict[str, str]:
    """VLLM_PLUGINS for a row: every general plugin but ours for dflash-native; ours included
    for dflash (VLLM_PLUGINS is a comma list of names to load; unset loads all)."""
    current = environ.get("VLLM_PLUGINS")
    if algorithm == "dflash-native":
        names = current.split(",") if current is not None else \
            [e.name for e in entry_points(group="vllm.general_plugins")]
        return {"VLLM_PLUGINS": ",".join(n for n in names if n and n != PLUGIN_NAME)}
    if algorithm == "dflash" and current is not None and PLUGIN_NAME not in current.split(","):
        return {"VLLM_PLUGINS": ",".join(n for n in (*current.split(","), PLUGIN_NAME) if n)}
    return {}


def split_algorithms(text: str) -> list[str]:
    """Split --algorithms at the commas outside [...], so that a row's settings may hold commas
    ('dflash[DFLASH_COST_MODEL=draft_fixed=0.2,draft_per_request=0.2]')."""
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise DFlashError(f"--algorithms {text!r}: brackets do not pair up")
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise DFlashError(f"--algorithms {text!r}: brackets do not pair up")
    entries = [e.strip() for e in (*entries, current) if e.strip()]
    if not entries:
        raise DFlashError("--algorithms is empty")
    return entries


def _check(args) -> tuple[dict[str, Variant], list[int]]:
    """The rows to run ("none" first: the others' speedups refer to it) and the levels."""
    names = dict.fromkeys(split_algorithms(args.algorithms))
    variants = {name: parse_algorithm(name) for name in names}
    variants = dict(sorted(variants.items(), key=lambda kv: bench.ALGORITHMS.index(kv[1].base)))
    try:
        levels = bench.parse_list(args.concurrency, int, "--concurrency")
    except ValueError:
        raise DFlashError(f"--concurrency must be a comma list of integers, got {args.concurrency!r}") from None
    if any(c < 1 for c in levels):
        raise DFlashError(f"--concurrency levels must be >= 1, got {levels}")
    if args.max_tokens < 1:
        raise DFlashError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.temperature < 0:
        raise DFlashError(f"--temperature must be >= 0, got {args.temperature}")
    if args.repeats < 1:
        raise DFlashError(f"--repeats must be >= 1, got {args.repeats}")
    if args.restarts < 1:
        raise DFlashError(f"--restarts must be >= 1, got {args.restarts}")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise DFlashError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if not args.tpot_bound > 0:  # also rejects nan
        raise DFlashError(f"--tpot-bound must be > 0, got {args.tpot_bound}")
    return variants, sorted(set(levels))


def read_prompts(args) -> tuple[list[str], dict]:
    """The prompts of --prompts / --prompts-file / --prompt-categories, and what they are (for
    the JSON)."""
    categories = None
    if args.prompt_categories is not None:
        categories = bench.parse_list(args.prompt_categories, str, "--prompt-categories")
    if args.prompts_file:
        path, name = Path(args.prompts_file), None
    else:
        name = args.prompts or "builtin"
        path = bench.prompt_set_path(name)
    prompts = bench.read_prompts(path, categories)
    about = {"set": name, "file": str(path), "categories": categories, "count": len(prompts)}
    return prompts, about


def summaries(rows: list[dict], args, about: dict) -> dict:
    """What the JSON carries besides the rows."""
    return {"prompts": about, "fixed_interactivity": bench.fixed_interactivity(rows, args.tpot_bound)}


def _prompts_for(prompts: list[str], count: int) -> list[str]:
    """`count` requests: fewer than the file holds are spread evenly over it (the evaluation
    sets are ordered by category); more repeat it."""
    if count < len(prompts):
        return [prompts[i * len(prompts) // count] for i in range(count)]
    return [prompts[i % len(prompts)] for i in range(count)]


def run(args) -> int:
    variants, levels = _check(args)
    # SIGTERM unwinds like Ctrl-C, so the running server is stopped in `finally`.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    prompts, about = read_prompts(args)
    print(f"[bench] {about['count']} prompts from {about['file']}"
          + (f" ({', '.join(about['categories'])})" if about["categories"] else ""),
          file=sys.stderr, flush=True)
    base = flags.options_from_args(args)
    if base.engine != "vllm":
        raise DFlashError("dflash bench compares vLLM servers; the config's engine must be vllm")
    base = replace(base, host="127.0.0.1", port=0)  # bench talks to 127.0.0.1 only
    output = Path(args.output)
    algorithms = list(variants)
    # Every configuration is checked before any server starts.
    resolved = {name: flags.resolve(_row_options(base, variant)) for name, variant in variants.items()}
    try:
        if args.sequential:
            rows, broken = _run_sequential(algorithms, resolved, prompts, levels, args, output,
                                           about)
        else:
            rows, broken = _run_interleaved(algorithms, resolved, prompts, levels, args, output,
                                            about)
    except KeyboardInterrupt:
        print(f"[bench] interrupted; finished rows are in {output}", file=sys.stderr)
        return 130
    rows = bench.add_speedups(rows)
    extra = summaries(rows, args, about)
    bench.write_json(rows, output, **extra)
    if not rows:
        raise DFlashError(f"no server configuration ran; see the logs next to {output}")
    plots = bench.write_plots(rows, output)
    print(bench.format_table(rows))
    print(bench.format_fixed_interactivity(extra["fixed_interactivity"]))
    print(f"[bench] wrote {output} and {', '.join(str(p) for p in plots)}", file=sys.stderr)
    return 0 if not broken and all(r["failed"] == 0 for r in rows) else 1


def _row_options(base: flags.ServeOptions, variant: Variant) -> flags.ServeOptions:
    """The server options of one row: its algorithm, drafter and environment."""
    spec = SPEC_ALGORITHM[variant.base]
    opts = replace(base, speculative_algorithm=spec,
                   env={**base.env, **plugin_env(variant.base), **variant.env})
    if spec != "DFLASH":  # the drafter settings are for the DFlash rows
        return replace(opts, speculative_draft_model_path=None, speculative_num_draft_tokens=None)
    if variant.draft is not None:
        opts = replace(opts, speculative_draft_model_path=variant.draft)
    if variant.draft_tokens is not None:
        opts = replace(opts, speculative_num_draft_tokens=variant.draft_tokens)
    return opts


def _run_sequential(algorithms, resolved, prompts, levels, args, output: Path, about: dict):
    """One server at a time, each sweeping every level; with --restarts, the whole round again
    with fresh servers, each row pooling its runs over every start."""
    samples: dict[tuple[str, int], list[_Sample]] = {}
    rows: list[dict] = []
    broken = []
    for start in range(args.restarts):
        if args.restarts > 1:
            print(f"[bench] start {start + 1} of {args.restarts}", file=sys.stderr, flush=True)
        for algorithm in (a for a in algorithms if a not in broken):
            try:
                with _started(algorithm, resolved[algorithm], args, output) as (server, model):
                    for concurrency in levels:
                        _prime(server.base_url, model, prompts, concurrency, args)
                        samples.setdefault((algorithm, concurrency), []).append(_measure(
                            server.base_url, model, prompts, concurrency, args, args.repeats))
            except (ServerExited, TimeoutError) as err:  # the other configurations still run
                broken.append(algorithm)
                print(f"[bench] {algorithm}: server failed, no rows: {err}", file=sys.stderr)
            last = start + 1 == args.restarts  # rows are printed once, when complete
            rows = [_row(a, c, runs, resolved[a], quiet=not (last and a == algorithm))
                    for (a, c), runs in samples.items() if a not in broken]
            if args.restarts > 1:
                for row in rows:
                    row["restarts"] = len(samples[(row["algorithm"], row["concurrency"])])
            bench.write_json(bench.add_speedups(rows), output, **summaries(rows, args, about))
    return rows, broken


def _run_interleaved(algorithms, resolved, prompts, levels, args, output: Path, about: dict):
    """Every server up at once; at each level, one run per configuration in turn, repeated, the
    order reversed every other round (ABBA), so that a drifting machine slows every row alike.
    With --restarts, all servers are started again for each round of levels, and each row pools
    its runs over every start: two starts of one server can differ by a few percent."""
    samples: dict[tuple[str, int], list[_Sample]] = {}  # one per run: --repeats per start
    rows: list[dict] = []
    broken = []
    for start in range(args.restarts):
        if args.restarts > 1:
            print(f"[bench] start {start + 1} of {args.restarts}", file=sys.stderr, flush=True)
        with ExitStack() as stack:
            servers = {}
            for algorithm in (a for a in algorithms if a not in broken):
                try:
                    servers[algorithm] = stack.enter_context(
                        _started(algorithm, resolved[algorithm], args, output))
                except (ServerExited, TimeoutError) as err:
                    broken.append(algorithm)
                    print(f"[bench] {algorithm}: server failed, no rows: {err}", file=sys.stderr)
            for concurrency in levels:
                order = list(servers)
                for repeat in range(start * args.repeats, (start + 1) * args.repeats):
                    for algorithm in (order if repeat % 2 == 0 else order[::-1]):
                        server, model = servers[algorithm]
                        _prime(server.base_url, model, prompts, concurrency, args)
                        samples.setdefault((algorithm, concurrency), []).append(_measure(
                            server.base_url, model, prompts, concurrency, args, 1))
                last = start + 1 == args.restarts  # rows are printed once, when complete
                rows = [_row(a, c, samples[(a, c)], resolved[a],
                             quiet=not (last and c == concurrency))
                        for c in levels for a in algorithms
                        if (a, c) in samples and a not in broken]
                for row in rows if args.restarts > 1 else ():
                    row["restarts"] = len(samples[(row["algorithm"],
                                                   row["concurrency"])]) // args.repeats
                bench.write_json(bench.add_speedups(rows), output, **summaries(rows, args, about))
    return rows, broken


@contextmanager
def _started(algorithm, opts, args, output: Path):
    """One server configuration, ready; stopped on exit."""
    launch = flags.vllm_launch(replace(opts, port=free_port()))
    log = output.with_name(f"{output.stem}.{_file_safe(algorithm)}.log")
    print(f"[bench] {algorithm}: starting server (log: {log})", file=sys.stderr, flush=True)
    server = Server(launch, log_path=log).start()
    try:
        ready_s = server.wait_ready(args.server_timeout)
        print(f"[bench] {algorithm}: ready after {ready_s:.0f} s", file=sys.stderr, flush=True)
        yield server, launch.model_name
    finally:
        server.stop()


def _request_options(args, **overrides) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature,
                ignore_eos=args.ignore_eos, request_timeout=args.request_timeout) | overrides


def _prime(base_url, model, prompts, concurrency, args):
    """Not measured: a short burst at the level, on the server about to be measured. It pays
    a new server's one-off costs of its first requests, and a server that sat idle while the
    others ran is slower in its next run (by 7% on average on a Zen 5 EPYC,
    docs/benchmarks.md); after the burst every run starts as under steady load."""
    asyncio.run(bench.run_point(base_url, model, _prompts_for(prompts, concurrency), concurrency,
                                **_request_options(args, max_tokens=min(args.max_tokens,
                                                                        PRIME_TOKENS))))


@dataclass
class _Sample:
    """Runs of one configuration at one level: request results, wall times, counter deltas."""

    results: list
    walls: list[float]
    counted: dict[str, float]


def _measure(base_url, model, prompts, concurrency, args, repeats) -> _Sample:
    count = max(args.num_prompts or len(prompts), concurrency)  # a level's requests all in flight
    before = bench.scrape_counters(base_url)
    results, walls = [], []
    for _ in range(repeats):
        run_results, wall = asyncio.run(bench.run_point(
            base_url, model, _prompts_for(prompts, count), concurrency, **_request_options(args)))
        results += run_results
        walls.append(wall)
    after = bench.scrape_counters(base_url)
    return _Sample(results, walls, {name: after[name] - before[name] for name in after})


def _row(algorithm: str, concurrency: int, samples: list[_Sample],
         opts: flags.ServeOptions | None = None, quiet: bool = False) -> dict:
    """One result row: every run of the configuration at this level, pooled; with the drafter
    it ran (`opts`: the row's server options), so that a JSON file says what it measured."""
    results = [r for s in samples for r in s.results]
    walls = [w for s in samples for w in s.walls]
    counted = None
    if algorithm != "none":
        counted = {name: sum(s.counted[name] for s in samples) for name in bench.SPEC_COUNTERS}
    row = bench.summarize(algorithm, concurrency, results, sum(walls),
                          dict.fromkeys(bench.SPEC_COUNTERS, 0.0) if counted else None, counted)
    if opts is not None and opts.engine == "vllm":
        row["dtype"] = flags.served_dtype(opts)
    if opts is not None and opts.speculative_draft_model_path is not None:
        row["draft_model"] = opts.speculative_draft_model_path
    if opts is not None and opts.speculative_num_draft_tokens is not None:
        # Not "num_draft_tokens": that is vLLM's counter of drafted tokens, set above.
        row["speculative_num_draft_tokens"] = opts.speculative_num_draft_tokens
    if len(walls) > 1:
        row["repeats"] = len(walls)
        row["output_tokens_per_s_runs"] = bench.per_run_rates(results, walls)
        if counted and len(samples) == len(walls):  # one sample a run: its own counters
            row["num_drafts_runs"] = [int(s.counted["vllm:spec_decode_num_drafts"])
                                      for s in samples]
    if quiet:
        return row
    print(f"[bench] {algorithm} c={concurrency}: {row['output_tokens_per_s']} tok/s, "
          f"TPOT {row['tpot_ms']} ms, TTFT {row['ttft_ms']} ms, tau {row['accept_length']}, "
          f"failed {row['failed']}", file=sys.stderr, flush=True)
    return row
