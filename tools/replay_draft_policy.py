"""Replay the draft policy at concurrency 1 on real drafts: how much speed each policy variant
could give, without a server.

Step 1, tracing (slow: runs the target and the drafter; skipped when --trace exists): for each
prompt, the target's greedy answer, then ONE teacher-forced drafter pass that drafts a block at
every answer position, as serving would draft there (same bonus token, same target features as
context; a block of --trace-block positions: give the served --draft-positions to see exactly
the served drafts, which vLLM drafts in blocks of that many positions). Kept per position: the
drafts' top-1 probabilities and which drafts equal the target's next tokens.

Step 2, replaying (fast): DraftPolicy decides step by step, as in the vLLM adapter, whether to run
the draft pass and how many drafts to verify. Greedy decoding emits the same tokens whatever is
verified, so which drafts are accepted is exact; only the step costs are assumed (--true-costs,
in units of a plain step). Reports tokens per step and the speedup over plain decoding for:
always verifying every draft, the adaptive policy with the platform preset, the same policy
skipping the pass after one that handed out nothing, the policy believing the true costs, and
the ceiling: an oracle that drafts only where drafts will pass and verifies exactly those.

Also reported, with no cost assumed: the drafter's acceptance when every step verifies the whole
traced block (all block - 1 drafts): tau per prompt (tokens per step, the figure the model card
compares rounds by), pooled over all prompts, and how often the first draft is right.

    python tools/replay_draft_policy.py --prompts-file P.jsonl --trace T.jsonl --output R.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from dflash_plugin.draft_policy import (
    DraftPolicy,
    PolicyMode,
    top1_probability,
    vllm_cpu_fp32_costs,
)
from dflash_plugin.draft_vocab import load_drafter_for_target
from dflash_plugin.features import FeatureCapture
from dflash_plugin.generate import generate_plain
from dflash_plugin.prompt_io import encode_user_turn, read_prompts_file, stop_token_ids
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.target import load_target
from dflash_plugin.train.batches import draft_block_batch, make_block_batch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts-file", required=True, help='JSONL with {"prompt": ...} or {"turns": [...]}')
    p.add_argument("--trace", required=True, help="JSONL of traced drafts (written if missing)")
    p.add_argument("--draft", help="DFlash drafter folder (default: the shipped one)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--draft-positions", type=int, default=4,
                   help="positions per draft pass, bonus token included (vLLM-CPU float32: 4)")
    p.add_argument("--trace-block", type=int,
                   help="positions of each traced drafter pass (default: the drafter's block). "
                        "vLLM drafts blocks of --draft-positions positions, and a shorter block "
                        "drafts other tokens (the drafter was trained on whole blocks): pass the "
                        "same number to replay what serving drafts")
    p.add_argument("--true-costs", default="draft=0.5,verify=0.075",
                   help="a draft pass and each verified draft, in plain steps (default: the AVX2 "
                        "EPYC's float32 step costs at batch 1 with P=4, docs/bench/overhead/"
                        "fp32-avx2-step-costs.jsonl)")
    p.add_argument("--output", required=True, help="JSON results")
    return p.parse_args()


@torch.inference_mode()
def trace_prompts(prompts_file: str, draft: str | None, max_new_tokens: int, out: Path,
                  trace_block: int | None):
    """One line per prompt: conf [answer positions, drafts] and match (0/1), same shape, and
    the block (positions per drafter pass) they were drafted with."""
    target, tokenizer = load_target(None, dtype=torch.float32)
    drafter = load_drafter_for_target(target, draft, torch.float32).eval()
    stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
    capture = FeatureCapture(target, list(drafter.config.dflash_config["target_layer_ids"]))
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    block = trace_block or drafter.block_size
    with out.open("w") as f:
        for index, record in enumerate(read_prompts_file(prompts_file)):
            prompt = encode_user_turn(tokenizer, record["turns"][0])
            answer = generate_plain(target, torch.tensor([prompt]), max_new_tokens,
                                    SamplingParams(temperature=0.0), 0, stops).token_ids
            ids = torch.tensor(prompt + list(answer))
            with capture.active():
                target.model(ids[None], use_cache=False)
                features = capture.take()[0].float()
            # Every answer token but the last is a bonus token some step could draft after.
            batch = make_block_batch(ids, torch.arange(len(prompt), ids.numel() - 1), block,
                                     drafter.mask_token_id, gamma=4.0)
            hidden = draft_block_batch(drafter, embed, batch, drafter.fuse_context(features[None]))
            logits = drafter.draft_logits(hidden, head).float()
            conf = top1_probability(logits).view(-1, block)[:, 1:]  # what the adapter reads
            match = ((drafter.to_target_ids(logits.argmax(-1)) == batch.labels)
                     & (batch.weights > 0)).view(-1, block)[:, 1:]
            f.write(json.dumps({"block": block,
                                "conf": [[round(x, 4) for x in row] for row in conf.tolist()],
                                "match": match.int().tolist()}) + "\n")
            print(f"traced {index + 1}: {len(answer)} tokens", flush=True)


def replay(traces: list[dict], policy: DraftPolicy | None, num_drafts: int, draft_cost: float,
           verify_cost: float, skip_after_empty: bool = False) -> dict:
    """Decode every trace once; policy None verifies all `num_drafts` drafts every step."""
    tokens = seconds = 0.0
    steps = passes = empty = verified = accepted = 0
    skip_next = False
    for trace in traces:
        conf = torch.tensor(trace["conf"])[:, :num_drafts]
        match = torch.tensor(trace["match"])[:, :num_drafts]
        position = 0
        while position < conf.shape[0]:
            steps += 1
            drafting = policy is None or policy.should_draft(1)
            if drafting and skip_next:
                drafting = skip_next = False
            if not drafting:
                tokens, seconds, position = tokens + 1, seconds + 1.0, position + 1
                continue
            passes += 1
            k = num_drafts if policy is None else policy.choose(1, conf[position:position + 1],
                                                                 num_drafts)[0]
            run = int(torch.cumprod(match[position, :k], 0).sum()) if k else 0
            if policy is not None and k:
                policy.observe([conf[position, :k]], [run])
            empty += k == 0
            skip_next = skip_after_empty and k == 0
            verified, accepted = verified + k, accepted + run
            tokens += 1 + run
            seconds += 1.0 + draft_cost + verify_cost * k
            position += 1 + run
    return {"speedup": round(tokens / seconds, 3), "tokens_per_step": round(tokens / steps, 3),
            "draft_pass_share": round(passes / steps, 3),
            "empty_pass_share": round(empty / max(passes, 1), 3),
            "accepted_share": round(accepted / max(verified, 1), 3)}


def walked_runs(match: torch.Tensor) -> list[int]:
    """Greedy decoding that verifies every draft in `match` [positions, drafts]: the accepted
    run of each step, each step starting after the previous one's run and bonus token."""
    runs, position = [], 0
    while position < match.shape[0]:
        runs.append(int(torch.cumprod(match[position], 0).sum()))
        position += 1 + runs[-1]
    return runs


def replay_oracle(traces: list[dict], num_drafts: int, draft_cost: float, verify_cost: float) -> dict:
    """The ceiling: a policy that knows the outcome drafts only where the first draft will be
    accepted and verifies exactly the drafts that will be."""
    tokens = seconds = steps = 0
    for trace in traces:
        for run in walked_runs(torch.tensor(trace["match"])[:, :num_drafts]):
            steps += 1
            tokens += 1 + run
            seconds += 1.0 + (draft_cost + verify_cost * run if run else 0.0)
    return {"speedup": round(tokens / seconds, 3), "tokens_per_step": round(tokens / steps, 3)}


def block_acceptance(traces: list[dict]) -> dict:
    """Greedy decoding that verifies every traced draft each step: tokens per step (tau, the
    bonus token included) averaged per prompt and pooled, and the first draft's acceptance."""
    taus, tokens, steps, first_right, first_drafted, drafts = [], 0, 0, 0, 0, 0
    for trace in traces:
        match = torch.tensor(trace["match"], dtype=torch.long)
        if match.numel() == 0:
            continue  # an answer of one token leaves no position to draft after
        drafts = match.shape[1]
        first_right, first_drafted = first_right + int(match[:, 0].sum()), first_drafted + len(match)
        prompt_steps = len(walked_runs(match))
        taus.append(len(match) / prompt_steps)
        tokens, steps = tokens + len(match), steps + prompt_steps
    if not taus:
        raise ValueError("no trace has a drafted position")
    return {"prompts": len(taus), "drafts_per_step": drafts,
            "tau_per_prompt": round(sum(taus) / len(taus), 3),
            "tau_pooled": round(tokens / steps, 3),
            "first_draft_accepted": round(first_right / first_drafted, 3)}


def main():
    args = parse_args()
    trace_file = Path(args.trace)
    if not trace_file.is_file():
        trace_prompts(args.prompts_file, args.draft, args.max_new_tokens, trace_file,
                      args.trace_block)
    traces = [json.loads(line) for line in trace_file.open()]
    blocks = {t.get("block") for t in traces}  # None: traced before blocks were recorded (16)
    if args.trace_block and blocks != {args.trace_block}:
        raise SystemExit(f"{trace_file} was traced with blocks {blocks}, not --trace-block "
                         f"{args.trace_block}: give another --trace path")
    costs = dict(item.split("=") for item in args.true_costs.split(","))
    draft_cost, verify_cost = float(costs["draft"]), float(costs["verify"])
    drafts = args.draft_positions - 1
    preset = vllm_cpu_fp32_costs(args.draft_positions)
    believed = replace(preset, verify_per_token=verify_cost,
                       draft_fixed=draft_cost - preset.draft_per_request)

    def adaptive(costs):
        return DraftPolicy(PolicyMode.ADAPTIVE, costs, block=drafts)

    rows = {"full": replay(traces, None, drafts, draft_cost, verify_cost),
            "adaptive": replay(traces, adaptive(preset), drafts, draft_cost, verify_cost),
            "adaptive, skip after an empty pass": replay(traces, adaptive(preset), drafts,
                                                         draft_cost, verify_cost, True),
            "adaptive, believing the true costs": replay(traces, adaptive(believed), drafts,
                                                         draft_cost, verify_cost),
            "oracle (knows which drafts pass)": replay_oracle(traces, drafts, draft_cost,
                                                              verify_cost)}
    for name, row in rows.items():
        print(f"{name}: {row}")
    whole_block = block_acceptance(traces)
    print(f"whole traced block, teacher-forced: {whole_block}")
    with open(args.output, "w") as f:
        json.dump({"prompts_file": args.prompts_file, "traces": len(traces),
                   "draft_positions": args.draft_positions, "trace_block": blocks.pop(),
                   "true_costs": args.true_costs,
                   "preset": vars(preset), "rows": rows, "whole_block": whole_block}, f, indent=1)


if __name__ == "__main__":
    main()
