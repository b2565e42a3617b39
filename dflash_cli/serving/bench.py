"""Benchmark client and runner for `dflash bench`: streaming requests through the official
`openai` AsyncOpenAI client at a fixed concurrency, speculative-decoding counters from
Prometheus /metrics, summary rows, and plots.

Per request, TTFT is the time to the first content chunk and TPOT is (latency - TTFT) /
(output tokens - 1), with output tokens taken from the usage record (a speculative step streams
several tokens in one chunk, so chunks are not tokens). Per sweep point, output tokens/s is all
output tokens over the wall time of the point, and the acceptance length is
1 + accepted / drafts from the counter differences before and after the point.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dflash_plugin.errors import DFlashError

DEFAULT_PROMPTS = Path(__file__).with_name("bench_prompts.jsonl")
# The repository checkout this module runs from (an installed package has no train_data/ here).
REPO_ROOT = Path(__file__).resolve().parents[2]
# --prompts presets: the built-in 32, the hand-written out-of-distribution evaluation set, and
# the 18 held-out prompts of the bundled drafter's training mix.
PROMPT_SETS = {
    "builtin": DEFAULT_PROMPTS,
    "ood": Path("train_data/eval/ood_user_prompts.jsonl"),
    "heldout": Path("train_data/smollm2-135m/eval_prompts_18.jsonl"),
}
ALGORITHMS = ("none", "ngram", "dflash-native", "dflash")
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


# ---------------------------------------------------------------------------------------------
# Prometheus counters


def parse_counters(text: str, names=SPEC_COUNTERS) -> dict[str, float]:
    """Sum of each counter over its label sets; `name` and `name_total` are the same counter."""
    totals = {name: 0.0 for name in names}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        base = metric.split("{", 1)[0]
        if base.endswith("_total"):
            base = base[: -len("_total")]
        if base in totals:
            try:
                totals[base] += float(value)
            except ValueError:
                continue
    return totals


def scrape_counters(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as response:
        return parse_counters(response.read().decode())


def acceptance_length(before: dict[str, float], after: dict[str, float]) -> float | None:
    """1 + accepted tokens per draft over the interval; None when nothing was drafted."""
    drafts = after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]
    accepted = (after["vllm:spec_decode_num_accepted_tokens"]
                - before["vllm:spec_decode_num_accepted_tokens"])
    return 1.0 + accepted / drafts if drafts > 0 else None


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass
class RequestResult:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    output_tokens: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def read_prompts(path: str | Path | None, categories: list[str] | None = None) -> list[str]:
    """Prompts from a JSONL file of {"prompt": ...} (or {"text": ...}, or {"turns": [...]}, first
    turn); with `categories`, only the records whose "category" is one of them."""
    from dflash_plugin.prompt_io import read_prompts_file
    path = path or DEFAULT_PROMPTS
    records = read_prompts_file(path)
    if categories:
        present = sorted({str(r.get("category")) for r in records if "category" in r})
        records = [r for r in records if r.get("category") in categories]
        if not records:
            raise DFlashError(f"{path}: no prompt in categories {', '.join(categories)}; its "
                              f"categories are {', '.join(present) or 'none (no category field)'}")
    return [rec["turns"][0] for rec in records]


def prompt_set_path(name: str, root: Path = REPO_ROOT) -> Path:
    """The file of a --prompts preset. The evaluation sets live in the repository's train_data/,
    which an installed package does not carry."""
    if name not in PROMPT_SETS:
        raise DFlashError(f"unknown --prompts {name!r}; choose from {', '.join(PROMPT_SETS)}")
    path = PROMPT_SETS[name]
    if path.is_absolute():
        return path
    if not (root / path).is_file():
        raise DFlashError(f"--prompts {name} reads {path} from the repository checkout, which is "
                          f"not at {root} (an installed package does not ship train_data/); run "
                          "from a checkout, or pass that file with --prompts-file")
    return root / path


async def stream_chat(client, model: str, prompt: str, *, max_tokens: int, temperature: float,
                      ignore_eos: bool) -> RequestResult:
    start = time.perf_counter()
    ttft, tokens = None, 0
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=temperature, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": ignore_eos})
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # any failure of one request is recorded, not fatal to the sweep
        return RequestResult(False, time.perf_counter() - start, error=f"{type(err).__name__}: {err}")
    return RequestResult(True, time.perf_counter() - start, ttft, tokens)


async def run_point(base_url: str, model: str, prompts: list[str], concurrency: int, *,
                    max_tokens: int, temperature: float, ignore_eos: bool = False,
                    request_timeout: float = 600.0) -> tuple[list[RequestResult], float]:
    """All prompts, at most `concurrency` in flight. Returns (results, wall seconds)."""
    import httpx
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=concurrency + 4,
                                                       max_keepalive_connections=concurrency + 4))
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=request_timeout,
                         max_retries=0, http_client=http)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt):
        async with gate:
            return await stream_chat(client, model, prompt, max_tokens=max_tokens,
                                     temperature=temperature, ignore_eos=ignore_eos)

    # Every request is bounded by the client timeout; the point as a whole by that per wave.
    point_timeout = request_timeout * math.ceil(len(prompts) / concurrency) + 60
    start = time.perf_counter()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), point_timeout)
    finally:
        await client.close()
    return results, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Rows


def _mean_ms(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(1000 * statistics.fmean(values), 2) if values else None


def _median_ms(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(1000 * statistics.median(values), 2) if values else None


def summarize(algorithm: str, concurrency: int, results: list[RequestResult], wall_s: float,
              before: dict[str, float] | None = None, after: dict[str, float] | None = None) -> dict:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    row = {
        "algorithm": algorithm, "concurrency": concurrency, "num_requests": len(results),
        "failed": len(results) - len(ok), "output_tokens": tokens, "duration_s": round(wall_s, 3),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "tpot_ms": _mean_ms(r.tpot_s for r in ok), "tpot_ms_p50": _median_ms(r.tpot_s for r in ok),
        "ttft_ms": _mean_ms(r.ttft_s for r in ok), "ttft_ms_p50": _median_ms(r.ttft_s for r in ok),
        "accept_length": None, "speedup": None,
    }
    if before is not None and after is not None:
        tau = acceptance_length(before, after)
        row["accept_length"] = round(tau, 3) if tau is not None else None
        for name in SPEC_COUNTERS:
            row[name.split(":")[1].removeprefix("spec_decode_")] = int(after[name] - before[name])
    errors = sorted({r.error for r in results if r.error})
    if errors:
        row["errors"] = errors[:5]
    return row


def per_run_rates(results: list[RequestResult], walls: list[float]) -> list[float]:
    """Output tokens/s of each of len(walls) equal-sized runs whose results were concatenated."""
    size = len(results) // len(walls)
    rates = []
    for i, wall in enumerate(walls):
        tokens = sum(r.output_tokens for r in results[i * size:(i + 1) * size] if r.ok)
        rates.append(round(tokens / wall, 2) if wall > 0 else None)
    return rates


def add_speedups(rows: list[dict]) -> list[dict]:
    """speedup = output tokens/s over the no-speculation row at the same concurrency."""
    base = {r["concurrency"]: r["output_tokens_per_s"] for r in rows if r["algorithm"] == "none"}
    for row in rows:
        reference = base.get(row["concurrency"])
        row["speedup"] = (round(row["output_tokens_per_s"] / reference, 3)
                          if reference and row["output_tokens_per_s"] is not None else None)
    return rows


def fixed_interactivity(rows: list[dict], tpot_bound: float) -> dict:
    """Throughput at fixed interactivity: per algorithm, the best output tokens/s over the
    concurrency sweep among the rows whose mean TPOT is at most `tpot_bound` times the TPOT of
    no speculation at concurrency 1 (what serving at a promised per-user speed can deliver)."""
    reference = next((r for r in rows if r["algorithm"] == "none" and r["concurrency"] == 1), None)
    summary = {"tpot_bound": tpot_bound, "reference_tpot_ms": None, "tpot_limit_ms": None,
               "algorithms": {}}
    if reference is None or not reference.get("tpot_ms"):
        summary["unavailable"] = "needs a 'none' row at concurrency 1 with a TPOT"
        return summary
    limit = tpot_bound * reference["tpot_ms"]
    summary["reference_tpot_ms"] = reference["tpot_ms"]
    summary["tpot_limit_ms"] = round(limit, 2)
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        # A level where requests failed does not deliver its TPOT to every user.
        within = [r for r in rows if r["algorithm"] == algorithm and not r.get("failed")
                  and r.get("tpot_ms") is not None and r.get("output_tokens_per_s") is not None
                  and r["tpot_ms"] <= limit]
        best = max(within, key=lambda r: r["output_tokens_per_s"], default=None)
        summary["algorithms"][algorithm] = None if best is None else {
            "concurrency": best["concurrency"], "output_tokens_per_s": best["output_tokens_per_s"],
            "tpot_ms": best["tpot_ms"], "speedup": None}
    plain = summary["algorithms"].get("none")
    for entry in summary["algorithms"].values():
        if entry is not None and plain is not None and plain["output_tokens_per_s"]:
            entry["speedup"] = round(entry["output_tokens_per_s"] / plain["output_tokens_per_s"], 3)
    return summary


def format_fixed_interactivity(summary: dict) -> str:
    bound = summary["tpot_bound"]
    if summary.get("unavailable"):
        return f"throughput at TPOT <= {bound}x plain decoding's at concurrency 1: " \
               f"{summary['unavailable']}"
    lines = [f"throughput at TPOT <= {bound}x plain decoding's at concurrency 1 "
             f"({summary['tpot_limit_ms']} ms):"]
    width = max(len(a) for a in summary["algorithms"])
    for algorithm, entry in summary["algorithms"].items():
        if entry is None:
            lines.append(f"  {algorithm.ljust(width)}  no level within the bound")
            continue
        speedup = "-" if entry["speedup"] is None else f"{entry['speedup']}x"
        lines.append(f"  {algorithm.ljust(width)}  {entry['output_tokens_per_s']} tok/s at "
                     f"concurrency {entry['concurrency']} (TPOT {entry['tpot_ms']} ms), "
                     f"{speedup} plain")
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    columns = ("algorithm", "concurrency", "output_tokens_per_s", "tpot_ms", "ttft_ms",
               "accept_length", "speedup", "failed")
    header = ("algorithm", "conc", "tok/s", "TPOT ms", "TTFT ms", "tau", "speedup", "failed")
    cells = [[("-" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def write_plots(rows: list[dict], output: Path) -> list[Path]:
    """<stem>_throughput.png and <stem>_speedup.png next to the JSON file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algorithms = [a for a in dict.fromkeys(r["algorithm"] for r in rows)]
    concurrencies = sorted({r["concurrency"] for r in rows})
    paths = []
    for key, label, name in (("output_tokens_per_s", "output tokens/s", "throughput"),
                             ("speedup", "speedup vs no speculation", "speedup")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        drawn = False
        for algorithm in algorithms:
            points = sorted((r["concurrency"], r[key]) for r in rows
                            if r["algorithm"] == algorithm and r.get(key) is not None)
            if points:
                ax.plot(*zip(*points), marker="o", label=algorithm)
                drawn = True
        if key == "speedup":
            ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs concurrency")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend()
        fig.tight_layout()
        path = output.with_name(f"{output.stem}_{name}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def parse_list(text: str, item=str, name: str = "list") -> list:
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    if not values:
        raise DFlashError(f"{name} is empty")
    return [item(v) for v in values]


def write_json(rows: list[dict], output: Path, **summary):
    """{"rows": [...], **summary} (e.g. prompts=..., fixed_interactivity=...)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(json.dumps({"rows": rows, **summary}, indent=2) + "\n")
    tmp.replace(output)
