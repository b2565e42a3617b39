"""Prompt-lookup drafts in the plugin against vLLM's n-gram method, offline, side by side.

Starts one vLLM engine per configuration in this process (no speculation; vLLM's ngram with the
settings `dflash serve --speculative-algorithm NGRAM` uses; the plugin's DFlash with
DFLASH_NGRAM_DRAFTS off; and on), then answers the prompts on every engine in turn, --concurrency
requests at a time (default 1), greedy, so a machine whose speed drifts slows them alike. Reports
output tokens/s per configuration and its ratio to no speculation, tokens per CPU-second of each
engine's processes (moves less on a shared machine), the plugin's own step and lookup counts, and
whether every answer equals plain decoding's token for token.

  python tools/compare_ngram_drafts.py --categories extraction,coding --max-tokens 128 \
      --out ngram-hybrid.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("none", "ngram", "dflash", "dflash+ngram")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts-file", default=str(ROOT / "train_data/eval/ood_user_prompts.jsonl"))
    p.add_argument("--categories", default="extraction,coding",
                   help="comma list of the prompts' categories ('' for all)")
    p.add_argument("--per-category", type=int, default=None,
                   help="only the first N prompts of each category")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--draft", help="drafter folder (default: the shipped one)")
    p.add_argument("--k", type=int, default=15, help="num_speculative_tokens of the DFlash rows")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--eager", action="store_true", help="no torch.compile (quicker start-up)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="prompts per generate call (a batch of this many requests)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default="compare-ngram-drafts.json")
    return p.parse_args(argv)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def children() -> dict[int, object]:
    import psutil

    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def cpu_seconds(procs) -> float:
    import psutil

    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def spec_config(name: str, args, drafter: str):
    if name == "ngram":
        from dflash_cli.serving.flags import NGRAM_DEFAULT_DRAFT_TOKENS, NGRAM_LOOKUP

        return {"method": "ngram", "num_speculative_tokens": NGRAM_DEFAULT_DRAFT_TOKENS - 1,
                **NGRAM_LOOKUP}
    if name.startswith("dflash"):
        return {"method": "dflash", "model": drafter, "num_speculative_tokens": args.k}
    return None


def start(name: str, args, target: str, drafter: str):
    from vllm import LLM

    os.environ["DFLASH_NGRAM_DRAFTS"] = "on" if name == "dflash+ngram" else "off"
    os.environ["DFLASH_STATS_EVERY"] = "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the worker call in drafting_counts
    before = set(children())
    kwargs = dict(model=target, dtype=args.dtype, max_model_len=2048, seed=0, max_num_seqs=8,
                  kv_cache_memory_bytes=1 << 30, disable_log_stats=False,
                  enforce_eager=args.eager)
    spec = spec_config(name, args, drafter)
    if spec:
        kwargs["speculative_config"] = spec
    llm = LLM(**kwargs)
    procs = [p for pid, p in children().items() if pid not in before]
    return llm, procs


def drafting_counts(llm) -> dict | None:
    """The plugin's step and lookup counts from the worker (None for other engines)."""
    def read(worker):
        from dataclasses import asdict

        drafting = getattr(worker.model_runner.drafter.model, "dflash_drafting", None) \
            if hasattr(worker.model_runner, "drafter") else None
        if drafting is None:
            return None
        ngram = drafting.ngram
        return dict(steps=asdict(drafting.counts),
                    lookup=None if ngram is None else asdict(ngram.counts))

    try:
        return llm.collective_rpc(read)[0]
    except Exception as err:  # a diagnostic only
        return {"error": f"{type(err).__name__}: {err}"}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import SamplingParams

    from dflash_cli.serving.bench import read_prompts
    from dflash_plugin.defaults import DEFAULT_DRAFTER_NAME, DRAFTERS_DIR
    from dflash_plugin.target import resolve_target

    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in CONFIGS]:
        sys.exit(f"unknown --configs {unknown}; choose from {', '.join(CONFIGS)}")
    categories = [c for c in args.categories.split(",") if c] or None
    prompts = read_prompts(args.prompts_file, categories)
    if args.per_category:
        from dflash_plugin.prompt_io import read_prompts_file

        seen: dict[str, int] = {}
        kept = []
        for record in read_prompts_file(args.prompts_file):
            category = record.get("category")
            if categories and category not in categories:
                continue
            seen[category] = seen.get(category, 0) + 1
            if seen[category] <= args.per_category:
                kept.append(record["turns"][0])
        prompts = kept
    target = str(resolve_target(None))
    drafter = args.draft or str(DRAFTERS_DIR / DEFAULT_DRAFTER_NAME)
    engines = {}
    for name in names:
        print(f"[compare] starting {name}", file=sys.stderr, flush=True)
        engines[name] = start(name, args, target, drafter)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    for llm, _ in engines.values():  # warm-up, not measured
        llm.chat(messages[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    totals = {n: dict(tokens=0, wall_s=0.0, cpu_s=0.0) for n in names}
    answers: dict[str, list] = {n: [] for n in names}
    step = args.concurrency
    groups = [messages[i:i + step] for i in range(0, len(messages), step)]
    for repeat in range(args.repeats):
        for index, group in enumerate(groups):
            order = names[index % len(names):] + names[:index % len(names)]  # rotate the order
            for name in order:
                llm, procs = engines[name]
                cpu0, began = cpu_seconds(procs), time.perf_counter()
                outs = [o.outputs[0] for o in llm.chat(group, params, use_tqdm=False)]
                totals[name]["wall_s"] += time.perf_counter() - began
                totals[name]["cpu_s"] += cpu_seconds(procs) - cpu0
                totals[name]["tokens"] += sum(len(o.token_ids) for o in outs)
                if repeat == 0:
                    answers[name] += [list(o.token_ids) for o in outs]
            print(f"[compare] group {index + 1}/{len(groups)} done", file=sys.stderr,
                  flush=True)
    rows = []
    for name in names:
        llm, _ = engines[name]
        t = totals[name]
        # (vLLM's spec-decode counters are not per engine here: each engine's stat logger
        # re-registers the process-wide Prometheus collectors, so only the last one counts.)
        rows.append(dict(config=name, tokens=t["tokens"], wall_s=round(t["wall_s"], 2),
                         tok_per_s=round(t["tokens"] / t["wall_s"], 2),
                         tok_per_cpu_s=round(t["tokens"] / t["cpu_s"], 2) if t["cpu_s"] else None,
                         same_as_none=(answers[name] == answers["none"]
                                       if "none" in answers else None),
                         plugin=drafting_counts(llm) if name.startswith("dflash") else None))
    if "none" in totals:
        base = next(r for r in rows if r["config"] == "none")
        for row in rows:
            row["speedup"] = round(row["tok_per_s"] / base["tok_per_s"], 3)
            if row["tok_per_cpu_s"] and base["tok_per_cpu_s"]:
                row["cpu_speedup"] = round(row["tok_per_cpu_s"] / base["tok_per_cpu_s"], 3)
    result = dict(cpu=cpu_model(), load_average=os.getloadavg(), prompts=args.prompts_file,
                  categories=categories, per_category=args.per_category,
                  num_prompts=len(prompts), concurrency=args.concurrency,
                  max_tokens=args.max_tokens,
                  dtype=args.dtype, eager=args.eager, k=args.k, drafter=drafter,
                  repeats=args.repeats, rows=rows)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))
    for llm, _ in engines.values():
        llm.llm_engine.engine_core.shutdown()
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
