"""Decoded tau of draft shapes, simulated from one teacher-forced pass per answer (T=0): the
drafter's chain, prompt lookup, the two together, the chain continued by lookup, DDTree at
several budgets, and DDTree with the lookup branch grafted on; with `--datastore`, also drafts
retrieved from the target's training answers (dflash_plugin/datastore.py)
(dflash_plugin/train/teacher_forced.py). At T=0 a shape accepts at
each answer position exactly what decoding accepts when it starts a block there, so a greedy
decode can be replayed from those lengths without running it
(tests/test_teacher_forced.py proves both on the real model).

    .venv/bin/python tools/draft_shapes.py --answers runs/ood-answers/responses.jsonl.gz \\
        --budgets 8,16,32,64 --output docs/bench/NAME.json \\
        --datastore train_data/smollm2-135m-real/responses.partial.jsonl.gz ...
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from dflash_plugin.datastore import AnswerDatastore, load_answers_datastore
from dflash_plugin.draft_vocab import load_drafter_for_target
from dflash_plugin.features import FeatureCapture
from dflash_plugin.lookup_tree import graft, two_branch_tree
from dflash_plugin.ngram import lookup_continuation
from dflash_plugin.prompt_io import json_lines
from dflash_plugin.target import load_target, resolve_target
from dflash_plugin.train.feature_store import target_features
from dflash_plugin.train.teacher_forced import (
    answer_sequences,
    block_candidates,
    decoded_tau,
    tree_acceptance,
)
from dflash_plugin.tree import build_tree


def spliced(chain: list[int], history: np.ndarray) -> list[int]:
    """One linear draft: the drafter's tokens until the history with them ends in an n-gram
    seen before, then the lookup's continuation from there (what a chain-only runner could
    verify)."""
    draft: list[int] = []
    for token in chain:
        drafted = np.concatenate([history, np.asarray(draft, history.dtype)])
        lookup = lookup_continuation(drafted, len(chain) - len(draft))
        if lookup:
            return draft + lookup
        draft.append(token)
    return draft


def read_answers(path: Path) -> list[dict]:
    return [record for _, _, record in json_lines(path)]


def shapes_at(log_probs, ids, history: np.ndarray, budgets: list[int],
              datastore: AnswerDatastore | None = None) -> dict:
    """Every shape's draft tree for one anchor, the history ending at it (root token 0: only
    the drafted paths matter)."""
    chain = ids[:, 0].tolist()
    lookup = lookup_continuation(history, len(chain))
    trees = {"chain": two_branch_tree(0, [chain]), "lookup": two_branch_tree(0, [lookup]),
             "chain+lookup": two_branch_tree(0, [chain, lookup]),
             "chain, then lookup": two_branch_tree(0, [spliced(chain, history)])}
    for b in budgets:
        trees[f"tree{b}"] = build_tree(0, log_probs[:, :b], ids[:, :b], b)
        trees[f"tree{b}+lookup"] = graft(build_tree(0, log_probs[:, :b], ids[:, :b], b), lookup)
    if datastore is not None:
        found = datastore.draft(history, len(chain))
        trees["lookup, else retrieved, else chain"] = two_branch_tree(0, [lookup or found or chain])
        trees["chain+lookup+retrieved"] = two_branch_tree(0, [chain, lookup, found])
        for b in budgets:
            tree = graft(build_tree(0, log_probs[:, :b], ids[:, :b], b), lookup)
            trees[f"tree{b}+lookup+retrieved"] = graft(tree, found)
    return trees


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=Path, required=True,
                        help="the target's greedy answers (tools/answer_real_prompts.py)")
    parser.add_argument("--drafter", default=None, help="default: the shipped drafter")
    parser.add_argument("--budgets", default="8,16,32,64")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--datastore", type=Path, nargs="*", default=[],
                        help="answer files to retrieve drafts from (never the evaluated ones)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    target, _ = load_target(resolve_target(None), dtype=torch.float32)
    drafter = load_drafter_for_target(target, args.drafter, torch.float32)
    records = read_answers(args.answers)
    datastore = load_answers_datastore(args.datastore) if args.datastore else None
    answered = [(seq, r.get("category") or r["id"].split("-")[1]) for r in records
                for seq in answer_sequences([r], args.answer_tokens)]  # none if too short
    capture = FeatureCapture(target, tuple(drafter.fields.target_layer_ids))
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    block = drafter.block_size
    taus = defaultdict(lambda: defaultdict(list))  # shape -> category -> decoded tau per answer
    nodes = defaultdict(list)
    start = time.perf_counter()
    for (ids, prompt_len), category in answered:
        with capture.active():
            feats = target_features(target, capture, ids, torch.float32)
        log_probs, top_ids = block_candidates(drafter, embed, head, feats, ids, prompt_len,
                                              max(budgets + [1]))
        tokens = np.asarray(ids)
        accepted = defaultdict(list)
        for i, anchor in enumerate(range(prompt_len, len(ids) - 1)):
            truth = tokens[anchor + 1:anchor + block]
            for name, tree in shapes_at(log_probs[i], top_ids[i], tokens[:anchor + 1],
                                        budgets, datastore).items():
                accepted[name].append(tree_acceptance(tree, truth))
                nodes[name].append(tree.num_drafted)
        for name, lengths in accepted.items():
            taus[name][category].append(decoded_tau(lengths))
    print(f"{len(answered)} answers in {time.perf_counter() - start:.0f} s", flush=True)
    results = {"answers": str(args.answers), "drafter": args.drafter or "shipped",
               "answer_tokens": args.answer_tokens,
               "datastore": [str(p) for p in args.datastore], "shapes": {}}
    for name, by_category in taus.items():
        every = [t for values in by_category.values() for t in values]
        results["shapes"][name] = {
            "decoded_tau": round(float(np.mean(every)), 3),
            "mean_drafted_nodes": round(float(np.mean(nodes[name])), 1),
            "per_category": {c: round(float(np.mean(v)), 2) for c, v in sorted(by_category.items())}}
        print(f"{name:>18}: tau {results['shapes'][name]['decoded_tau']:.2f}, "
              f"{results['shapes'][name]['mean_drafted_nodes']:.0f} nodes", flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
