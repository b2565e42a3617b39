"""Benchmark DDTree against linear DFlash and plain decoding on the Hugging Face reference path.

On the same prompts, in one run: no speculation, linear DFlash, and DDTree at each budget.
Reports tau (mean accepted length incl. the bonus: mean over rounds, then over prompts, as the
papers do) and decode tokens/s, plus the cost of one target verify pass per budget (a tree of
budget+1 nodes with tree attention) against one linear block, which is what bounds the useful
budget on a given machine. Writes a JSON file and a PNG plot.

    python tools/bench_ddtree.py --draft DRAFTER --prompts-file prompts.jsonl --budgets 16,32,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from dflash_plugin import kv_cache
from dflash_plugin.draft_vocab import load_drafter_for_target
from dflash_plugin.generate import SpecDecoder, generate_plain
from dflash_plugin.prompt_io import encode_user_turn, read_prompts_file, stop_token_ids
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.target import TORCH_DTYPES, load_target
from dflash_plugin.tree import build_tree, top_candidates
from dflash_plugin.tree_decode import TreeDecoder



def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", required=True, help="DFlash drafter folder")
    p.add_argument("--prompts-file", help='JSONL with {"prompt": ...} or {"turns": [...]}')
    p.add_argument("--budgets", default="16,32,64,128", help="comma-separated DDTree budgets")
    p.add_argument("--target", help="Hugging Face target folder (default: embedded SmolLM2-135M)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    p.add_argument("--dtype", choices=list(TORCH_DTYPES), default="bfloat16")
    p.add_argument("--verify-context", type=int, default=256, help="cached tokens when timing verify passes")
    p.add_argument("--verify-repeats", type=int, default=5)
    p.add_argument("--verify-only", action="store_true", help="only time verify passes (no --prompts-file)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--output", default="bench_ddtree.json", help="JSON path; the plot goes next to it")
    return p.parse_args()


def timed_interleaved(fns: dict, repeats: int) -> dict:
    """Median wall ms of each fn; rounds run every fn once, so a busy machine slows all alike."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            began = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - began) * 1000)
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


@torch.inference_mode()
def verify_cost(decoder: TreeDecoder, budgets: list[int], context: int, repeats: int) -> dict:
    """ms per target verify pass over a cached context: a linear block vs a tree per budget,
    and ms to build each tree from the draft log-probs (top-k + heap)."""
    target, block = decoder.target, decoder.block_size
    cache = DynamicCache(config=target.config)
    target(torch.randint(100, 1000, (1, context)), past_key_values=cache, use_cache=True)
    log_probs = torch.log_softmax(torch.randn(block - 1, target.config.vocab_size) * 3, dim=-1)
    build = {b: (lambda b=b: build_tree(5, *top_candidates(log_probs, b), b)) for b in budgets}
    trees = {b: make() for b, make in build.items()}

    def linear():
        target(torch.randint(100, 1000, (1, block)), past_key_values=cache, use_cache=True)
        kv_cache.truncate(cache, context)

    def tree_pass(tree):
        decoder.verify(tree, context, cache)
        kv_cache.truncate(cache, context)

    passes = {"linear": linear, **{b: (lambda b=b: tree_pass(trees[b])) for b in budgets}}
    verify_ms, build_ms = timed_interleaved(passes, repeats), timed_interleaved(build, repeats)
    tree = {str(b): {"nodes": trees[b].num_nodes, "verify_ms": verify_ms[b], "build_ms": build_ms[b],
                     "vs_linear": round(verify_ms[b] / verify_ms["linear"], 3)} for b in budgets}
    return {"context": context, "block_size": block, "linear_verify_ms": verify_ms["linear"], "tree": tree}


def run_method(decode, prompts: list[torch.Tensor], args, stops) -> dict:
    """Decode every prompt; tau and tokens/s pooled over prompts."""
    sampling = SamplingParams(temperature=args.temperature)
    results = [decode(ids, args.max_new_tokens, sampling, 0, stops) for ids in prompts]
    taus = [r.stats.mean_accept_length for r in results if r.stats.num_steps]
    tokens, wall = sum(len(r.token_ids) for r in results), sum(r.wall_s for r in results)
    return {"tau": statistics.mean(taus) if taus else 1.0, "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": tokens / wall, "target_passes": sum(r.num_target_passes for r in results),
            "token_ids": [r.token_ids for r in results]}


def compare_methods(target, drafter, prompts, budgets, args, stops) -> dict:
    methods = {"plain": lambda ids, n, s, seed, st: generate_plain(target, ids, n, s, seed, st),
               "dflash": SpecDecoder(target, drafter, block_size=args.block_size).generate}
    for budget in budgets:
        methods[f"ddtree_{budget}"] = TreeDecoder(target, drafter, budget, args.block_size).generate
    runs = {}
    for name, decode in methods.items():
        decode(prompts[0], 4, SamplingParams(), 0, stops)  # warm-up: lazy init off the clock
        runs[name] = run_method(decode, prompts, args, stops)
        print(f"{name:>12}: tau {runs[name]['tau']:.2f}  {runs[name]['tokens_per_s']:.1f} tok/s", flush=True)
    plain_ids = runs["plain"]["token_ids"]
    for run in runs.values():  # only meaningful at T=0: sampled runs draw differently
        run["identical_to_plain"] = run["token_ids"] == plain_ids
    for run in runs.values():
        del run["token_ids"]
    return runs


def _budget_axis(ax, budgets: list[int], ylabel: str):
    ax.set(xscale="log", xlabel="tree budget", ylabel=ylabel)
    ax.minorticks_off()
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.legend()


def plot(report: dict, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets, runs, cost = report["budgets"], report["runs"], report["verify_cost"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, label) in zip(axes, [("tau", "tau (accepted + bonus)"), ("tokens_per_s", "decode tokens/s")]):
        ax.plot(budgets, [runs[f"ddtree_{b}"][key] for b in budgets], "o-", label="DDTree")
        ax.axhline(runs["dflash"][key], color="C1", ls="--", label="DFlash (linear)")
        ax.axhline(runs["plain"][key], color="C2", ls=":", label="no speculation")
        _budget_axis(ax, budgets, label)
    axes[2].plot(budgets, [cost["tree"][str(b)]["verify_ms"] for b in budgets], "o-", label="tree verify")
    axes[2].axhline(cost["linear_verify_ms"], color="C1", ls="--", label=f"linear block of {cost['block_size']}")
    _budget_axis(axes[2], budgets, f"ms per verify pass ({cost['context']} cached tokens)")
    fig.suptitle(f"{report['target']} + {report['draft']} ({report['dtype']}, T={report['temperature']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args()
    if not (args.prompts_file or args.verify_only):
        raise SystemExit("--prompts-file is required unless --verify-only")
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    target, tokenizer = load_target(args.target, dtype=TORCH_DTYPES[args.dtype])
    drafter = load_drafter_for_target(target, args.draft, TORCH_DTYPES[args.dtype], "full")
    cost = verify_cost(TreeDecoder(target, drafter, 1, args.block_size), budgets,
                       args.verify_context, args.verify_repeats)
    report = {"target": args.target or "SmolLM2-135M-Instruct", "draft": str(args.draft),
              "dtype": args.dtype, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "budgets": budgets, "verify_cost": cost}
    print(json.dumps(cost), flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.verify_only:
        stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
        prompts = [torch.tensor([encode_user_turn(tokenizer, r["turns"][0])])
                   for r in read_prompts_file(args.prompts_file)]
        report.update(num_prompts=len(prompts),
                      runs=compare_methods(target, drafter, prompts, budgets, args, stops))
    out.write_text(json.dumps(report, indent=2))
    if not args.verify_only:
        plot(report, out.with_suffix(".png"))
    print(f"wrote {out}" + ("" if args.verify_only else f" and {out.with_suffix('.png')}"))


if __name__ == "__main__":
    main()
