"""Draft policies side by side on the reference path: which one makes `dflash generate` fastest.

On the same prompts, in one run, prompt by prompt (each prompt runs every variant once, in an
order that rotates, so a busy machine slows them alike): plain decoding, DFlash verifying a
fixed N-1 drafts, and the adaptive policy with its preset cost model. Each variant keeps one
decoder across prompts, as a server keeps its policy across requests. Reports tokens/s, speedup
over plain, tokens per target pass, and whether every output equals plain decoding's. Writes
JSON.

    python tools/compare_draft_policies.py --prompts-file P.jsonl --dtype float32 --output F.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_plugin.adaptive_decode import AdaptiveSpecDecoder
from dflash_plugin.draft_vocab import load_drafter_for_target
from dflash_plugin.generate import SpecDecoder, generate_plain
from dflash_plugin.prompt_io import encode_user_turn, read_prompts_file, stop_token_ids
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.target import TORCH_DTYPES, load_target

VARIANTS = ("plain", "fixed", "preset")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts-file", required=True, help='JSONL with {"prompt": ...} or {"turns": [...]}')
    p.add_argument("--draft", help="DFlash drafter folder (default: the shipped one)")
    p.add_argument("--target", help="Hugging Face target folder (default: embedded SmolLM2-135M)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}")
    p.add_argument("--fixed-n", type=int, default=4, help="fixed: tokens per verify pass incl. bonus")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=list(TORCH_DTYPES), default="float32")
    p.add_argument("--output", required=True, help="JSON results")
    return p.parse_args()


def build_variants(names, target, drafter, fixed_n):
    decoders = {}
    for name in names:
        if name == "plain":
            decoders[name] = None
        elif name == "fixed":
            decoders[name] = SpecDecoder(target, drafter, num_verify_tokens=fixed_n)
        elif name == "preset":
            decoders[name] = AdaptiveSpecDecoder(target, drafter)
        else:
            raise SystemExit(f"unknown variant {name!r}; expected some of {VARIANTS}")
    return decoders


def main():
    args = parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if "plain" not in names:
        names.insert(0, "plain")  # the reference for speedup and identity
    dtype = TORCH_DTYPES[args.dtype]
    target, tokenizer = load_target(args.target, dtype=dtype)
    drafter = load_drafter_for_target(target, args.draft, dtype)
    stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
    decoders = build_variants(names, target, drafter, args.fixed_n)
    totals = {n: {"tokens": 0, "seconds": 0.0, "passes": 0, "identical": 0} for n in names}
    records = read_prompts_file(args.prompts_file)
    warm_up = torch.tensor([encode_user_turn(tokenizer, "Hello!")])
    for decoder in decoders.values():  # first calls pay one-off costs (allocations, kernels)
        if decoder is not None:
            decoder.generate(warm_up, 8, SamplingParams(), 0, stops)
    generate_plain(target, warm_up, 8, SamplingParams(), 0, stops)
    for index, record in enumerate(records):
        ids = torch.tensor([encode_user_turn(tokenizer, record["turns"][0])])
        order = names[index % len(names):] + names[:index % len(names)]
        outputs = {}
        for name in order:
            decoder = decoders[name]
            began = time.perf_counter()
            if decoder is None:
                result = generate_plain(target, ids, args.max_new_tokens, SamplingParams(), 0, stops)
            else:
                result = decoder.generate(ids, args.max_new_tokens, SamplingParams(), 0, stops)
            seconds = time.perf_counter() - began
            outputs[name] = result.token_ids
            totals[name]["tokens"] += len(result.token_ids)
            totals[name]["seconds"] += seconds
            totals[name]["passes"] += result.num_target_passes
        for name in names:
            totals[name]["identical"] += outputs[name] == outputs["plain"]
        print(f"prompt {index + 1}/{len(records)}: " + ", ".join(
            f"{n} {totals[n]['tokens'] / totals[n]['seconds']:.1f}" for n in names), flush=True)
    plain_rate = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    rows = []
    for name in names:
        t = totals[name]
        rate = t["tokens"] / t["seconds"]
        row = {"variant": name, "tokens_per_s": round(rate, 2), "speedup": round(rate / plain_rate, 3),
               "tokens_per_pass": round(t["tokens"] / max(t["passes"], 1), 3),
               "identical": f"{t['identical']}/{len(records)}"}
        rows.append(row)
        print(json.dumps(row))
    with open(args.output, "w") as f:
        json.dump({"prompts_file": args.prompts_file, "max_new_tokens": args.max_new_tokens,
                   "dtype": args.dtype, "fixed_n": args.fixed_n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
