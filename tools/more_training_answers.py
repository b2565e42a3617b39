"""More target answers for another training round of a drafter.

Draws new prompts from the same generator as `dflash train --stages prompts` (none repeats a
prompt already answered, none shares a template with the held-out split), then has the target
answer them through vLLM exactly like the *responses* stage. Made
train_data/smollm2-135m/responses_extra*.jsonl.gz:

    .venv/bin/python tools/more_training_answers.py --per-category 300 \\
        --output train_data/smollm2-135m/responses_extra1.jsonl.gz

Answers are saved chunk by chunk next to the output (NAME.partial.jsonl); run the same command
again after a stop and only the unanswered prompts are answered.

Train on them: concatenate all answer files into a new work folder's responses.jsonl and run
`dflash train --stages features,train --init-from LAST_EXPORT` there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

from dflash_plugin.target import resolve_target
from dflash_plugin.train import prompts as prompt_set
from dflash_plugin.train.responses import generate_responses

DATA = Path(__file__).resolve().parent.parent / "train_data" / "smollm2-135m"


def answered_prompts(paths: list[Path]) -> list[prompt_set.Prompt]:
    used = []
    for path in paths:
        with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
            for line in f:
                row = json.loads(line)
                used.append(prompt_set.Prompt(row["id"], row["category"], row["prompt"]))
    return used


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, required=True)
    parser.add_argument("--output", type=Path, required=True, help="answers, .jsonl.gz")
    parser.add_argument("--data-dir", type=Path, default=DATA,
                        help="eval_prompts.jsonl and the responses*.jsonl.gz already answered")
    parser.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=256, help="prompts answered per save")
    args = parser.parse_args()

    held_out = prompt_set.read_jsonl(args.data_dir / "eval_prompts.jsonl")
    used = answered_prompts(sorted(args.data_dir.glob("responses*.jsonl.gz")))
    new = prompt_set.more_prompts(args.per_category, used, held_out, seed=args.seed)
    print(f"{len(new)} new prompts ({len(used)} already answered)", flush=True)
    # Answers land in a partial file chunk by chunk: a run stopped (session end, Ctrl-C) and
    # started again with the same arguments draws the same prompts and answers only the rest.
    partial = args.output.with_name(args.output.name.removesuffix(".jsonl.gz") + ".partial.jsonl")
    generate_responses(resolve_target(args.target), new, partial, max_tokens=args.max_tokens,
                       seed=args.seed, chunk=args.chunk)
    with partial.open("rb") as src, gzip.open(args.output, "wb") as dst:
        shutil.copyfileobj(src, dst)
    partial.unlink()
    print(f"wrote {args.output}")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
