"""Served drafts against the reference path's, token by token, on the same answer text.

Served, the vLLM adapter's full-block drafts are accepted less often than the reference path's
teacher-forced drafts (docs/benchmark-history.md, session 27). Two causes are possible, and
this script separates them: vLLM's greedy answer may differ from Hugging Face's at near-ties
(other text, other acceptance), or vLLM's drafter may draft differently from the reference
drafter given the same context (a fault in the served drafting).

Phase 1 (`served`, run in its own process): vLLM offline, in-process engine, this plugin with
DFLASH_DRAFT_POLICY=full (or, with --native, vLLM's own DFlash: the plugin excluded through
VLLM_PLUGINS), greedy, one prompt at a time (concurrency 1). Every draft pass's bonus token and
full draft block is recorded, with vLLM's answer.

Phase 2 (`compare`): the reference drafter (dflash_plugin, Hugging Face target) drafts, teacher-
forced on vLLM's own answer, at every position the served decoding started a block; the two
blocks are compared draft by draft, and both are scored against vLLM's answer.

    python tools/compare_served_drafts.py --prompts-file P.jsonl --output R.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts-file", required=True)
    p.add_argument("--draft", help="drafter folder (default: the shipped one)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="first N prompts only (0: all)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--native", action="store_true", help="vLLM's native DFlash, not the plugin")
    p.add_argument("--num-drafts", type=int, default=15,
                   help="num_speculative_tokens; the reference drafts blocks of this + 1")
    p.add_argument("--served", help="phase 1's JSONL (default: next to --output)")
    p.add_argument("--phase", choices=["all", "served", "compare"], default="all")
    p.add_argument("--output", required=True, help="JSON summary")
    return p.parse_args(argv)


def load_prompts(args, tokenizer) -> list[list[int]]:
    from dflash_plugin.prompt_io import encode_user_turn, read_prompts_file

    records = read_prompts_file(args.prompts_file)
    if args.limit:
        records = records[:args.limit]
    return [encode_user_turn(tokenizer, r["turns"][0]) for r in records]


def run_served(args, served_path: Path):
    """vLLM + plugin, full blocks, greedy: each prompt's answer and draft passes."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the drafter runs in this process
    os.environ["DFLASH_DRAFT_POLICY"] = "full"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.native:
        os.environ["VLLM_PLUGINS"] = ""  # a list that names no plugin
    from vllm import LLM, SamplingParams

    from dflash_plugin.defaults import default_drafter_path
    from dflash_plugin.target import resolve_target

    passes: list[tuple[int, list[int]]] = []

    def record(next_token_ids, drafts):
        for bonus, row in zip(next_token_ids.tolist(), drafts.tolist()):
            passes.append((bonus, row))

    if args.native:
        from vllm.v1.spec_decode.dflash import DFlashProposer

        original_propose = DFlashProposer.propose

        def recording_propose(self, *a, **kw):
            drafts = original_propose(self, *a, **kw)
            record(a[4] if len(a) > 4 else kw["next_token_ids"], drafts)
            return drafts

        DFlashProposer.propose = recording_propose
    else:
        import vllm_ext.drafting as drafting_module

        original_select = drafting_module.Drafting.select

        def recording_select(self, drafts, next_token_ids):
            record(next_token_ids, drafts)
            return original_select(self, drafts, next_token_ids)

        drafting_module.Drafting.select = recording_select
    draft = args.draft or str(default_drafter_path())
    llm = LLM(model=str(resolve_target(None)), dtype=args.dtype, max_model_len=2048, seed=0,
              max_num_seqs=1, kv_cache_memory_bytes=1 << 30,
              speculative_config={"method": "dflash", "model": draft,
                                  "num_speculative_tokens": args.num_drafts})
    prompts = load_prompts(args, llm.get_tokenizer())
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    with served_path.open("w") as f:
        for prompt in prompts:
            passes.clear()
            out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
            f.write(json.dumps({"prompt": prompt, "answer": list(out.outputs[0].token_ids),
                                "passes": passes}) + "\n")
            print(f"served: {len(out.outputs[0].token_ids)} tokens, {len(passes)} passes",
                  flush=True)


def reference_blocks(target, drafter, capture, prompt: list[int], answer: list[int],
                     starts: list[int], block: int):
    """The reference drafter's block of `block` positions after each answer index in `starts`
    (bonus = answer[i]), teacher-forced on prompt + answer: [len(starts), block - 1] target ids."""
    import torch

    from dflash_plugin.train.batches import draft_block_batch, make_block_batch

    ids = torch.tensor(prompt + answer)
    with capture.active():
        target.model(ids[None], use_cache=False)
        features = capture.take()[0].float()
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    anchors = torch.tensor([len(prompt) + i for i in starts])
    batch = make_block_batch(ids, anchors, block, drafter.mask_token_id, gamma=4.0)
    hidden = draft_block_batch(drafter, embed, batch, drafter.fuse_context(features[None]))
    logits = drafter.draft_logits(hidden, head).float()
    return drafter.to_target_ids(logits.argmax(-1)).view(-1, block)[:, 1:].tolist()


def compare(args, served_path: Path) -> dict:
    import torch

    from dflash_plugin.acceptance import matching_prefix_length
    from dflash_plugin.draft_vocab import load_drafter_for_target
    from dflash_plugin.features import FeatureCapture
    from dflash_plugin.generate import generate_plain
    from dflash_plugin.prompt_io import stop_token_ids
    from dflash_plugin.sampling import SamplingParams
    from dflash_plugin.target import load_target

    torch.set_grad_enabled(False)
    target, tokenizer = load_target(None, dtype=torch.float32)
    drafter = load_drafter_for_target(target, args.draft, torch.float32).eval()
    capture = FeatureCapture(target, list(drafter.config.dflash_config["target_layer_ids"]))
    stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
    totals = dict(passes=0, same_block=0, first_same=0, served_tokens=0, reference_tokens=0,
                  hf_same_answer=0, prompts=0, misaligned=0)
    position_agree = [0] * args.num_drafts
    per_prompt = []
    for line in served_path.read_text().splitlines():
        record = json.loads(line)
        prompt, answer, passes = record["prompt"], record["answer"], record["passes"]
        hf = generate_plain(target, torch.tensor([prompt]), len(answer),
                            SamplingParams(temperature=0.0), 0, stops).token_ids
        totals["hf_same_answer"] += list(hf) == answer
        # Walk the served steps: each pass's bonus token sits at answer index `at`.
        starts, at = [], 0
        for bonus, drafts in passes:
            if at >= len(answer):  # a pass after the last kept token (max_tokens, a stop)
                break
            if answer[at] != bonus:
                totals["misaligned"] += 1
                break
            starts.append(at)
            at += 1 + matching_prefix_length(drafts, answer[at + 1:])
        starts = [s for s in starts if s < len(answer) - 1]  # a block needs a next token
        ref = reference_blocks(target, drafter, capture, prompt, answer, starts,
                               args.num_drafts + 1)
        served_runs, ref_runs = [], []
        for s, ref_row, (_, served_row) in zip(starts, ref, passes):
            truth = answer[s + 1:]
            served_runs.append(matching_prefix_length(served_row, truth))
            ref_runs.append(matching_prefix_length(ref_row, truth))
            totals["same_block"] += served_row == ref_row
            totals["first_same"] += served_row[0] == ref_row[0]
            for k, (a, b) in enumerate(zip(served_row, ref_row)):
                position_agree[k] += a == b
        totals["passes"] += len(starts)
        totals["served_tokens"] += sum(1 + r for r in served_runs)
        totals["reference_tokens"] += sum(1 + r for r in ref_runs)
        totals["prompts"] += 1
        per_prompt.append({"answer_tokens": len(answer), "hf_same": list(hf) == answer,
                           "served_tau": round(sum(1 + r for r in served_runs) / max(len(starts), 1), 3),
                           "reference_tau_same_starts": round(
                               sum(1 + r for r in ref_runs) / max(len(starts), 1), 3),
                           "first_block_diff": next((i for i, (ref_row, (_, row)) in
                                                     enumerate(zip(ref, passes))
                                                     if ref_row != row), None)})
        print(json.dumps(per_prompt[-1]), flush=True)
    n = max(totals["passes"], 1)
    return {"prompts": totals["prompts"], "passes": totals["passes"],
            "misaligned_prompts": totals["misaligned"],
            "hf_greedy_equals_vllm": totals["hf_same_answer"],
            "identical_blocks": round(totals["same_block"] / n, 4),
            "first_draft_agreement": round(totals["first_same"] / n, 4),
            "agreement_by_position": [round(a / n, 4) for a in position_agree],
            "served_tokens_per_pass": round(totals["served_tokens"] / n, 3),
            "reference_tokens_per_pass_same_starts": round(totals["reference_tokens"] / n, 3),
            "per_prompt": per_prompt}


def main(argv=None) -> int:
    args = parse_args(argv)
    served = Path(args.served or Path(args.output).with_suffix(".served.jsonl"))
    if args.phase in ("all", "served") and not (args.phase == "all" and served.exists()):
        if args.phase == "all":  # vLLM in a process of its own (it sets threads, plugins)
            cmd = [sys.executable, __file__, *sys.argv[1:], "--phase", "served",
                   "--served", str(served)]
            subprocess.run(cmd, check=True)
        else:
            run_served(args, served)
            return 0
    summary = compare(args, served)
    Path(args.output).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_prompt"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
