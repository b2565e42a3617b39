"""Write training prompts in the voice of the target's users, sampled from the target itself
(dflash_plugin/train/self_prompts.py), with a report of what was dropped and why.

    .venv/bin/python tools/self_prompts.py --count 4000 \\
        --output train_data/smollm2-135m-self/prompts.jsonl.gz

Then answer them: tools/answer_real_prompts.py --prompts THAT --output .../responses.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dflash_plugin.target import resolve_target
from dflash_plugin.train.prompts import write_jsonl
from dflash_plugin.train.self_prompts import write_self_prompts
from dflash_plugin.train.sources.contamination import find_eval_files
from dflash_plugin.train.sources.stage import default_eval_root


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, required=True, help="prompts to keep")
    parser.add_argument("--output", type=Path, required=True, help="prompts, .jsonl.gz")
    parser.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    args = parser.parse_args()
    root = default_eval_root()
    eval_files = find_eval_files(root, exclude=(args.output.parent,))
    start = time.perf_counter()
    prompts, report = write_self_prompts(resolve_target(args.target), args.count,
                                         eval_files=eval_files, seed=args.seed,
                                         engine=args.engine, dtype=args.dtype,
                                         temperature=args.temperature, top_p=args.top_p)
    write_jsonl(args.output, prompts)
    d = report.as_dict()
    d["eval_files"] = [str(Path(p).resolve().relative_to(root.resolve())) for p in eval_files]
    d["seconds"] = round(time.perf_counter() - start)
    report_path = args.output.with_name("prompts_report.json")
    report_path.write_text(json.dumps(d, indent=1) + "\n")
    print(f"wrote {len(prompts)} prompts to {args.output}: {json.dumps(d)}")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
