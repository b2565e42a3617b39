"""Have the target answer a prompt set to the end: its chat template, greedy, to EOS with a cap
of 1,024 new tokens, batched through vLLM; an answer that goes round in a loop stops after two
cycles (`dflash_plugin/train/repeats.py`). A prompt's follow-up is asked on the target's own first
answer (a second turn, stored as ID/followup).

    .venv/bin/python tools/answer_real_prompts.py \\
        --output train_data/smollm2-135m-real/responses.jsonl.gz

Answers are saved chunk by chunk to NAME.partial.jsonl next to the output; the same command
run again (after a stop, on another machine with the partial file, or with it gzipped beside the
output as NAME.partial.jsonl.gz) answers only the rest. When
every prompt is answered the partial file becomes the gzipped output and a summary is written
to NAME.summary.json. Train on it: copy it to a work folder's responses.jsonl and run
`dflash train --stages features,train ...` there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time
from pathlib import Path

from dflash_plugin.prompt_io import stop_token_ids
from dflash_plugin.target import resolve_target
from dflash_plugin.train import prompts as prompt_set
from dflash_plugin.train.repeats import trim_loop
from dflash_plugin.train.responses import generate_responses

# A batch step of 4,096 tokens can wait minutes for a core while another job runs on this
# machine; vLLM's default 300 s RPC limit then kills the engine mid-chunk.
os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "7200")

DATA = Path(__file__).resolve().parent.parent / "train_data" / "smollm2-135m-real"


def summarise(rows: list[dict], max_tokens: int, eos_ids: set[int]) -> dict:
    lengths = [len(r["response_ids"]) for r in rows]
    capped = sum(1 for r in rows if len(r["response_ids"]) >= max_tokens
                 and (not r["response_ids"] or r["response_ids"][-1] not in eos_ids))
    # Answers saved before answering stopped at loops ran on to the cap: trimmed as training
    # reads them (repeats.trim_loop), they count what a drafter learns from.
    learnt = [len(trim_loop(r["response_ids"])) for r in rows]
    return {"records": len(rows), "second_turns": sum(r.get("turn") == 2 for r in rows),
            "answer_tokens": sum(lengths), "answer_tokens_before_loops": sum(learnt),
            "prompt_tokens": sum(len(r["prompt_ids"]) for r in rows),
            "mean_answer_tokens": round(sum(lengths) / max(1, len(lengths)), 1),
            "answers_at_cap": capped,
            "answers_looping": sum(r.get("end") == "loop" or kept < n
                                   for r, kept, n in zip(rows, learnt, lengths)),
            "max_tokens": max_tokens}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=DATA / "prompts.jsonl.gz")
    parser.add_argument("--output", type=Path, required=True, help="answers, .jsonl.gz")
    parser.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--max-model-len", type=int, default=4096,
                        help="context for a prompt, its first answer, the follow-up and the "
                             "second answer")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="default: bfloat16 where the CPU has native bf16, else float32")
    parser.add_argument("--limit", type=int, help="answer only this many prompts, spread over "
                                                  "the categories (a check run)")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=512, help="prompts answered per save")
    args = parser.parse_args()
    if args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")

    prompts = prompt_set.spread_over_categories(prompt_set.read_jsonl(args.prompts), args.limit)
    partial = args.output.with_name(args.output.name.removesuffix(".gz")
                                    .removesuffix(".jsonl") + ".partial.jsonl")
    saved = partial.with_name(partial.name + ".gz")  # a stopped run's answers, as committed
    partial.parent.mkdir(parents=True, exist_ok=True)  # before the engine's minutes of start-up
    if saved.is_file() and not partial.is_file():
        with gzip.open(saved, "rb") as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    target = resolve_target(args.target)
    start = time.perf_counter()
    stats = generate_responses(target, prompts, partial, max_tokens=args.max_tokens,
                               seed=args.seed, chunk=args.chunk, engine=args.engine,
                               dtype=args.dtype, max_model_len=args.max_model_len)
    elapsed = time.perf_counter() - start
    if stats["prompts"]:
        print(f"this run: {stats['prompts']} prompts + {stats['followups']} follow-ups, "
              f"{stats['response_tokens']} answer tokens in {elapsed:.0f} s "
              f"({stats['response_tokens'] / elapsed:.1f} tokens/s including engine start); "
              f"skipped (no room for a whole answer): {stats['skipped_too_long']} prompts, "
              f"{stats['followups_too_long']} follow-ups", flush=True)
    rows = [json.loads(line) for line in partial.open() if line.strip()]
    answered = {r["id"] for r in rows}
    left = [p for p in prompts if p.id not in answered]
    if len(left) > stats["skipped_too_long"]:
        print(f"{len(left)} prompts still to answer; run again to go on")
        return
    from transformers import AutoTokenizer

    summary = summarise(rows, args.max_tokens,
                        stop_token_ids(AutoTokenizer.from_pretrained(str(target))))
    summary["prompts_file"] = str(args.prompts)
    with partial.open("rb") as src, gzip.open(args.output, "wb") as dst:
        shutil.copyfileobj(src, dst)
    partial.unlink()
    summary_path = args.output.with_name(args.output.name.removesuffix(".gz")
                                         .removesuffix(".jsonl") + ".summary.json")
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.output}: {json.dumps(summary)}")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
