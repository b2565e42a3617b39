"""A training work folder from several answer files, with whole prompts held out of each.

    .venv/bin/python tools/mix_answers.py --workdir runs/long \\
        --answers real=train_data/smollm2-135m-real/responses.partial.jsonl.gz:256 \\
        --answers self=train_data/smollm2-135m-self/responses.jsonl.gz:128

Writes WORKDIR/responses.jsonl (every kept record, shuffled: what `dflash train --stages train
--online-features` reads) and WORKDIR/heldout-NAME.jsonl per file (answers to prompts training
never sees, for tools/teacher_forced_tau.py). A follow-up (ID/followup) goes where its first turn
goes, so no held-out answer's prompt is in training. The split depends on --seed only, so a
long run resumed on another machine can rebuild the same folder.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dflash_plugin.prompt_io import json_lines
from dflash_plugin.train.responses import FOLLOWUP_SUFFIX


def read_answers(path: str | Path) -> list[dict]:
    return [record for _, _, record in json_lines(path)]


def prompt_of(record: dict) -> str:
    """The id of the prompt a record answers: a follow-up's first turn."""
    return record["id"].removesuffix(FOLLOWUP_SUFFIX)


def hold_out(records: list[dict], prompts: int, rng: random.Random) -> tuple[list, list]:
    """(kept, held out): `prompts` whole prompts drawn at random, with their follow-ups."""
    ids = sorted({prompt_of(r) for r in records})
    if prompts > len(ids):
        raise ValueError(f"cannot hold out {prompts} prompts of {len(ids)}")
    held = set(rng.sample(ids, prompts))
    return ([r for r in records if prompt_of(r) not in held],
            [r for r in records if prompt_of(r) in held])


def mix(sources: list[tuple[str, Path, int]], workdir: Path, seed: int) -> dict:
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    train, report = [], {"seed": seed, "sources": {}}
    for name, path, prompts in sources:
        kept, held = hold_out(read_answers(path), prompts, rng)
        train += kept
        write_jsonl(workdir / f"heldout-{name}.jsonl", held)
        report["sources"][name] = {"file": str(path), "trained": len(kept), "held_out": len(held)}
    seen = [r["id"] for r in train]
    if len(seen) != len(set(seen)):
        raise ValueError("two answer files share record ids: each record must come once")
    rng.shuffle(train)
    write_jsonl(workdir / "responses.jsonl", train)
    report["trained"] = len(train)
    (workdir / "mix.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def write_jsonl(path: Path, rows: list[dict]):
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def source(value: str) -> tuple[str, Path, int]:
    name, sep, rest = value.partition("=")
    path, _, count = rest.rpartition(":")
    if not sep or not name or not path or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PATH:HELD_OUT_PROMPTS, got {value!r}")
    return name, Path(path), int(count)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--answers", type=source, action="append", required=True,
                        help="NAME=PATH:N, N whole prompts of the file held out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(mix(args.answers, args.workdir, args.seed), indent=1))


if __name__ == "__main__":
    main()
