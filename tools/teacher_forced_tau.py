"""Teacher-forced tau of drafters on answer files, side by side (dflash_plugin/train/
teacher_forced.py): the same sequences for every drafter, drawn with a fixed seed.

    .venv/bin/python tools/teacher_forced_tau.py \\
        --drafter shipped=dflash_plugin/drafters/SmolLM2-135M-Instruct-DFlash-b16 \\
        --drafter new=runs/x/export \\
        --answers ood=runs/ood-answers.jsonl --answers self=train_data/.../responses.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from dflash_plugin.draft_vocab import load_drafter_for_target
from dflash_plugin.prompt_io import json_lines
from dflash_plugin.target import load_target, resolve_target
from dflash_plugin.train.teacher_forced import (answer_sequences, teacher_forced_tau,
                                                 with_pass_length)


def named(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, path


def read_records(path: str, skip_ids: set[str]) -> list[dict]:
    return [r for _, _, r in json_lines(path) if r["id"] not in skip_ids]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", type=named, action="append", required=True)
    parser.add_argument("--answers", type=named, action="append", required=True)
    parser.add_argument("--skip-ids-from", action="append", default=[],
                        help="a responses file whose ids are left out (the training set)")
    parser.add_argument("--sequences", type=int, default=24)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ngram", action="store_true",
                        help="also prompt lookup, and per drafter the better of the two per anchor")
    parser.add_argument("--by-confidence", action="store_true",
                        help="also each drafter's first-token accuracy per bucket of the "
                             "target's confidence in that token")
    parser.add_argument("--pass-length", type=int, action="append", default=[],
                        help="also each drafter with a draft pass of this many positions (bonus "
                             "included) instead of its trained block, as NAME@P")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    target, _ = load_target(resolve_target(None), dtype=torch.float32)
    drafters = {name: load_drafter_for_target(target, path, torch.float32)
                for name, path in args.drafter}
    drafters |= {f"{name}@{p}": with_pass_length(d, p)
                 for name, d in list(drafters.items()) for p in args.pass_length}
    skip = set()
    for path in args.skip_ids_from:
        skip |= {r["id"] for r in read_records(path, set())}
    results = {"drafters": dict(args.drafter), "sequences": args.sequences,
               "answer_tokens": args.answer_tokens, "seed": args.seed, "answers": {}}
    for label, path in args.answers:
        records = read_records(path, skip)
        random.Random(f"{args.seed}:{label}").shuffle(records)
        seqs = answer_sequences(records, args.answer_tokens)[:args.sequences]
        start = time.perf_counter()
        res = teacher_forced_tau(target, drafters, seqs, ngram=args.ngram,
                                 by_confidence=args.by_confidence)
        results["answers"][label] = {"file": path, **res}
        print(f"{label} ({len(seqs)} sequences, {time.perf_counter() - start:.0f} s): "
              + ", ".join(f"{n} {r['tau']:.3f}" for n, r in res.items()), flush=True)
        for name, r in res.items():
            if "first_token_by_target_confidence" in r:
                print(f"  {name} first token right, by the target's confidence: " + ", ".join(
                    f"{k} {v['first_right']} ({v['share']:.0%})"
                    for k, v in r["first_token_by_target_confidence"].items()), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
