"""Generate text with the target alone or with DFlash speculative decoding (Hugging Face
reference path, batch size 1). Prints one JSON object per prompt."""

from __future__ import annotations

import json
import os
import sys

import torch
from tqdm import tqdm

from dflash_plugin.cpu_features import default_cpu_dtype
from dflash_plugin.errors import DFlashError
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.target import TORCH_DTYPES

HELP = "generate text with or without DFlash speculation (reference path)"


def add_arguments(p):
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one prompt text")
    source.add_argument("--prompts-file", help='JSONL with {"prompt": ...} or {"turns": [...]}')
    p.add_argument("--target", help="Hugging Face target folder (default: embedded SmolLM2-135M)")
    p.add_argument("--draft", help="DFlash drafter folder (default: the shipped drafter)")
    p.add_argument("--no-speculation", action="store_true", help="decode with the target alone")
    p.add_argument("--compare", action="store_true",
                   help="also decode without speculation and report the speedup")
    p.add_argument("--speculative-algorithm", default="DFLASH", type=str.upper,
                   choices=["DFLASH", "DDTREE", "LOOKUP_TREE"],
                   help="linear blocks, draft trees, or draft trees with a prompt-lookup "
                        "branch (the n-gram continuation of the history grafted on)")
    p.add_argument("--tree-budget", type=int, default=32,
                   help="DDTREE, LOOKUP_TREE: the drafter's nodes per draft tree")
    p.add_argument("--datastore", nargs="+", default=None, metavar="FILE",
                   help="LOOKUP_TREE: also graft the continuation retrieved from these answer "
                        "files of the target (the training stage's responses, .jsonl[.gz]) or "
                        "a saved datastore (.npz)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None, metavar="N",
                   help="DFLASH: tokens per verify pass including the bonus token, as in "
                        "SGLang (default: the block size); the drafter still fills its whole "
                        "block and only the first N-1 drafts are verified (with --draft-policy "
                        "adaptive: at most N-1)")
    p.add_argument("--draft-policy", choices=["adaptive", "fixed"], default="adaptive",
                   help="DFLASH: adaptive verifies, each round, the drafts worth their cost "
                        "(from the drafter's confidence, calibrated by what was accepted, and "
                        "the step costs; possibly none, skipping the draft pass where no draft "
                        "is expected to pay for it), as the vLLM plugin does; fixed always "
                        "verifies N-1 drafts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=list(TORCH_DTYPES), default=None,
                   help="default: bfloat16, or float32 on a CPU without native bfloat16 "
                        "(no AVX512-BF16 / AMX), where bfloat16 matmuls are several times slower")
    p.add_argument("--draft-vocab", choices=["auto", "full"], default="auto",
                   help="auto: draft over the drafter's training vocabulary when its folder "
                        "keeps one (draft_vocab.json; a cheaper draft LM head); full: the "
                        "target's whole vocabulary")
    p.add_argument("--output", help="write the JSON lines here instead of stdout")


def build_decoder(args, target):
    """A callable (input_ids, max_new, sampling, seed, stops) -> GenerationResult."""
    from dflash_plugin.draft_vocab import load_drafter_for_target
    from dflash_plugin.generate import SpecDecoder

    drafter = load_drafter_for_target(target, args.draft, TORCH_DTYPES[args.dtype], args.draft_vocab)
    if args.speculative_algorithm == "DDTREE":
        from dflash_plugin.tree_decode import TreeDecoder
        return TreeDecoder(target, drafter, budget=args.tree_budget, block_size=args.block_size).generate
    if args.speculative_algorithm == "LOOKUP_TREE":
        from dflash_plugin.lookup_tree import LookupTreeDecoder
        from dflash_plugin.datastore import load_answers_datastore
        datastore = load_answers_datastore(args.datastore) if args.datastore else None
        return LookupTreeDecoder(target, drafter, budget=args.tree_budget,
                                 block_size=args.block_size, datastore=datastore).generate
    decoder_class = SpecDecoder
    if args.draft_policy == "adaptive":
        from dflash_plugin.adaptive_decode import AdaptiveSpecDecoder as decoder_class
    return decoder_class(target, drafter, block_size=args.block_size,
                         num_verify_tokens=args.speculative_num_draft_tokens).generate


def _row(result, **extra) -> dict:
    return {"token_ids": result.token_ids, "num_target_passes": result.num_target_passes,
            "mean_accept_length": round(result.stats.mean_accept_length, 4) if result.stats.num_steps else 1.0,
            "wall_s": round(result.wall_s, 4), "tokens_per_s": round(result.tokens_per_s, 2),
            "finish_reason": result.finish_reason, **extra}


def run_conversation(decode, tokenizer, turns, args, sampling, stops):
    """Decode every turn, feeding earlier answers back (multi-turn prompts)."""
    from dflash_plugin.prompt_io import encode_chat

    messages, results = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        ids = torch.tensor([encode_chat(tokenizer, messages)])
        result = decode(ids, args.max_new_tokens, sampling, args.seed, stops)
        results.append(result)
        answer = [t for t in result.token_ids if t not in stops]
        messages.append({"role": "assistant", "content": tokenizer.decode(answer)})
    return results


def _merge(results):
    """One result for a multi-turn conversation: tokens concatenated, stats pooled."""
    from dflash_plugin.generate import GenerationResult

    merged = GenerationResult([t for r in results for t in r.token_ids], results[-1].finish_reason,
                              sum(r.num_target_passes for r in results), sum(r.wall_s for r in results))
    for r in results:
        merged.stats.accept_lengths += r.stats.accept_lengths
        merged.stats.drafted_tokens += r.stats.drafted_tokens
    return merged


def run(args) -> int:
    from dflash_plugin.generate import generate_plain
    from dflash_plugin.prompt_io import read_prompts_file, stop_token_ids
    from dflash_plugin.target import load_target

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k)
    if args.max_new_tokens < 1:
        raise DFlashError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.datastore:
        if args.speculative_algorithm != "LOOKUP_TREE":
            raise DFlashError("--datastore drafts a branch of LOOKUP_TREE's draft trees; add "
                              "--speculative-algorithm LOOKUP_TREE")
        missing = [p for p in args.datastore if not os.path.isfile(p)]
        if missing:
            raise DFlashError(f"--datastore: no such file: {', '.join(missing)}")
    records = read_prompts_file(args.prompts_file) if args.prompts_file else [{"turns": [args.prompt]}]
    if args.dtype is None:
        args.dtype = default_cpu_dtype() or "bfloat16"
    target, tokenizer = load_target(args.target, dtype=TORCH_DTYPES[args.dtype])
    stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
    plain = lambda ids, n, s, seed, stop: generate_plain(target, ids, n, s, seed, stop)  # noqa: E731
    decode = plain if args.no_speculation else build_decoder(args, target)
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        for rec in tqdm(records, desc="prompts", disable=len(records) < 2, file=sys.stderr):
            result = _merge(run_conversation(decode, tokenizer, rec["turns"], args, sampling, stops))
            row = _row(result, prompt=rec["turns"][0] if len(rec["turns"]) == 1 else rec["turns"],
                       text=tokenizer.decode(result.token_ids, skip_special_tokens=True))
            if args.compare and not args.no_speculation:
                base = _merge(run_conversation(plain, tokenizer, rec["turns"], args, sampling, stops))
                row.update(baseline_tokens_per_s=round(base.tokens_per_s, 2),
                           speedup=round(base.wall_s / result.wall_s * len(result.token_ids)
                                         / max(1, len(base.token_ids)), 3),
                           identical_to_baseline=base.token_ids == result.token_ids)
            out.write(json.dumps(row) + "\n")
            out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
