"""tools/answers_progress.py on a hand-made answer folder: the progress table's per-phase sums and
the estimate are computed from the saved records, and ANSWERS.md's other text is kept."""

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "answers_progress", Path(__file__).parent.parent / "tools" / "answers_progress.py")
answers_progress = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(answers_progress)

NOTES = """Intro line.

| records | answered | follow-ups | answer tokens | before a loop |
|---|---|---:|---:|---:|
| 1-2 | old | 0 | 1 | 1 |

About 999 answer tokens per prompt remain once loops are cut (old),
so the whole set gives about 9M; some more: about 9.9 more hours of this CPU.
Kept line.
"""


def _record(i: int, answer: list[int], end: str, turn: int = 1) -> dict:
    suffix = "/followup" if turn == 2 else ""
    return {"id": f"p{i}{suffix}", "category": "chat", "prompt_ids": [1, 2],
            "response_ids": answer, "end": end, "turn": turn}


@pytest.fixture()
def data(tmp_path, monkeypatch):
    monkeypatch.setattr(answers_progress, "PHASES", ((2, "to the cap"), (None, "stopped at loops")))
    loop = list(range(32))
    records = [
        _record(0, [7] * 5, "eos"),
        _record(1, [9] + loop * 4, "cap"),  # cut after the third cycle's first span: 1 + 3 * 32
        _record(2, [5] * 10, "loop"),
        _record(2, [6] * 20, "eos", turn=2),
        _record(3, [4] * 30, "cap"),
    ]
    with gzip.open(tmp_path / "responses.partial.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    with gzip.open(tmp_path / "prompts.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"prompt": str(i)}) + "\n" for i in range(10))
    (tmp_path / "ANSWERS.md").write_text(NOTES)
    return tmp_path


def test_rows_sum_each_phase(data):
    rows = answers_progress.phase_rows(answers_progress.read_records(data))
    assert [(r["first"], r["last"]) for r in rows] == [(1, 2), (3, 5)]
    assert rows[0]["tokens"] == 5 + 1 + 128 and rows[0]["learnt"] == 5 + 1 + 96
    assert rows[1]["followups"] == 1 and rows[1]["tokens"] == 60
    assert rows[1]["ends"] == {"loop": 1, "eos": 1, "cap": 1}


def test_notes_rewritten_in_place(data, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["answers_progress", "--data", str(data), "--rate", "1.0"])
    answers_progress.main()
    text = (data / "ANSWERS.md").read_text()
    assert text.startswith("Intro line.") and text.rstrip().endswith("Kept line.")
    assert "| 3-5 | stopped at loops (1 loops, 1 EOS, 1 at the cap) | 1 | 60 | 60 |" in text
    assert "| **5** (4 prompts) | | **1** | **194** | **162** |" in text
    # 60 tokens over the segmented phase's 2 prompts: 30 per prompt, 10 prompts in all
    assert "About 30 answer tokens per prompt" in text
    # 6M tokens at 30 per prompt, 4 prompts answered: about 200,000 more, at 1 prompt/s
    assert "some 200,000 more: about 55.6 more hours" in text
    assert "999" not in text


def test_reached_target_says_so_and_what_the_rest_would_take(data, monkeypatch):
    monkeypatch.setattr(answers_progress, "TARGET_TOKENS", 150)
    monkeypatch.setattr(sys, "argv", ["answers_progress", "--data", str(data), "--rate", "0.001"])
    answers_progress.main()
    text = " ".join((data / "ANSWERS.md").read_text().split())
    # 162 tokens before loops >= 150; 6 of 10 prompts left at 0.001 prompt/s: 1.7 hours
    assert ("the 6M-token target is reached (162 tokens before loops) with 4 of its 10 prompts "
            "answered; the other 6 would take about 1.7 more hours") in text
    assert "more: about" not in text


def test_missing_table_is_an_error(data, monkeypatch):
    (data / "ANSWERS.md").write_text("no table here\n")
    monkeypatch.setattr(sys, "argv", ["answers_progress", "--data", str(data)])
    with pytest.raises(SystemExit, match="not found"):
        answers_progress.main()
    assert (data / "ANSWERS.md").read_text() == "no table here\n"
