"""tools/mix_answers.py on hand-made answer files: whole prompts held out with their follow-ups,
no held-out prompt in training, the same split from the same seed, and clear errors."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "mix_answers", Path(__file__).parent.parent / "tools" / "mix_answers.py")
mix_answers = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mix_answers)


def answers(prefix: str, prompts: int, followups_every: int) -> list[dict]:
    rows = []
    for i in range(prompts):
        rows.append({"id": f"{prefix}-{i}", "response_ids": [i]})
        if i % followups_every == 0:
            rows.append({"id": f"{prefix}-{i}/followup", "response_ids": [i, i]})
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_prompts_keep_their_followups_and_stay_out(tmp_path):
    real = write(tmp_path / "real.jsonl.gz", answers("real", 40, 3))
    own = write(tmp_path / "self.jsonl", answers("self", 20, 5))
    report = mix_answers.mix([("real", real, 6), ("self", own, 2)], tmp_path / "w", seed=7)

    train = read(tmp_path / "w" / "responses.jsonl")
    held_real = read(tmp_path / "w" / "heldout-real.jsonl")
    held_self = read(tmp_path / "w" / "heldout-self.jsonl")
    held = held_real + held_self
    assert len({mix_answers.prompt_of(r) for r in held_real}) == 6
    assert len({mix_answers.prompt_of(r) for r in held_self}) == 2
    # every record lands exactly once, and no prompt is on both sides
    assert sorted(r["id"] for r in train + held) == sorted(
        r["id"] for r in answers("real", 40, 3) + answers("self", 20, 5))
    assert not {mix_answers.prompt_of(r) for r in train} & {mix_answers.prompt_of(r) for r in held}
    # a held-out prompt with a follow-up brings it along
    held_ids = {r["id"] for r in held_real}
    for r in held_real:
        first = mix_answers.prompt_of(r)
        if int(first.split("-")[1]) % 3 == 0:
            assert f"{first}/followup" in held_ids
    assert report["trained"] == len(train)
    assert report["sources"]["real"]["held_out"] == len(held_real)
    # shuffled, not one file after the other
    assert [r["id"].startswith("self") for r in train] != sorted(
        r["id"].startswith("self") for r in train)


def test_same_seed_same_split_other_seed_other_split(tmp_path):
    real = write(tmp_path / "real.jsonl", answers("real", 50, 4))

    def split(seed, name):
        mix_answers.mix([("real", real, 5)], tmp_path / name, seed=seed)
        return (read(tmp_path / name / "responses.jsonl"),
                read(tmp_path / name / "heldout-real.jsonl"))

    assert split(3, "a") == split(3, "b")
    assert split(3, "a")[1] != split(4, "c")[1]


def test_bad_input_is_refused(tmp_path):
    real = write(tmp_path / "real.jsonl", answers("real", 4, 2))
    with pytest.raises(ValueError, match="cannot hold out 5 prompts of 4"):
        mix_answers.mix([("real", real, 5)], tmp_path / "w", seed=0)
    with pytest.raises(ValueError, match="share record ids"):
        mix_answers.mix([("a", real, 1), ("b", real, 1)], tmp_path / "w", seed=0)
    with pytest.raises(Exception, match="NAME=PATH:HELD_OUT_PROMPTS"):
        mix_answers.source("real.jsonl")
    assert mix_answers.source("r=/a/b.jsonl:12") == ("r", Path("/a/b.jsonl"), 12)
