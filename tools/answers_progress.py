"""Rewrite the progress table and the estimate in ANSWERS.md from the answers saved so far.

    .venv/bin/python tools/answers_progress.py [--rate PROMPTS_PER_SECOND]

Reads responses.partial.jsonl (or its .gz) of train_data/smollm2-135m-real/ and replaces the
table under "Answered so far" and the paragraph after it that estimates what is left; then
`tools/build_real_prompts.py --card-only` copies ANSWERS.md into the data card.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dflash_plugin.prompt_io import json_lines
from dflash_plugin.train.repeats import trim_loop

DATA = Path(__file__).resolve().parent.parent / "train_data" / "smollm2-135m-real"
TARGET_TOKENS = 6_000_000
# How the saved records were answered, in the order they were saved (the records carry no dtype
# or mode): the first 881 in float32 to the cap, the next 296 in bf16 to the cap, the rest in bf16
# stopped at loops.
PHASES = ((881, "float32, to the cap"), (1177, "bf16, to the cap"), (None, "bf16, stopped at loops"))


def read_records(data: Path) -> list[dict]:
    plain, packed = data / "responses.partial.jsonl", data / "responses.partial.jsonl.gz"
    return [rec for _, _, rec in json_lines(plain if plain.is_file() else packed)]


def phase_rows(records: list[dict]) -> list[dict]:
    rows, start = [], 0
    for end, how in PHASES:
        part = records[start:end]
        if not part:
            break
        ends = {k: sum(r.get("end") == k for r in part) for k in ("loop", "eos", "cap")}
        rows.append({"first": start + 1, "last": start + len(part), "how": how,
                     "followups": sum(r.get("turn") == 2 for r in part),
                     "tokens": sum(len(r["response_ids"]) for r in part),
                     "learnt": sum(len(trim_loop(r["response_ids"])) for r in part),
                     "ends": ends})
        start += len(part)
    return rows


def table(rows: list[dict], total: int) -> str:
    lines = ["| records | answered | follow-ups | answer tokens | before a loop |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        how = r["how"]
        if how.endswith("loops"):
            e = r["ends"]
            how += f" ({e['loop']:,} loops, {e['eos']:,} EOS, {e['cap']:,} at the cap)"
        lines.append(f"| {r['first']:,}-{r['last']:,} | {how} | {r['followups']:,} | "
                     f"{r['tokens']:,} | {r['learnt']:,} |")
    followups = sum(r["followups"] for r in rows)
    lines.append(f"| **{total:,}** ({total - followups:,} prompts) | | **{followups:,}** | "
                 f"**{sum(r['tokens'] for r in rows):,}** | **{sum(r['learnt'] for r in rows):,}** |")
    return "\n".join(lines)


def estimate(rows: list[dict], num_prompts: int, rate: float) -> str:
    """Tokens per prompt over the segmented records (follow-ups' answers included), and what the
    6M-token target still needs."""
    seg = rows[-1]
    per_prompt = seg["learnt"] / max(1, seg["last"] - seg["first"] + 1 - seg["followups"])
    answered = sum(r["last"] - r["first"] + 1 - r["followups"] for r in rows)
    learnt = sum(r["learnt"] for r in rows)
    needed = answered + max(0.0, TARGET_TOKENS - learnt) / per_prompt
    left = max(0, round(needed) - answered)
    whole = learnt + (num_prompts - answered) * per_prompt
    head = (f"About {round(per_prompt)} answer tokens per prompt remain once loops are cut (over "
            f"the segmented records, follow-ups included),\nso the whole set gives about "
            f"{whole / 1e6:.1f}M; ")
    if learnt >= TARGET_TOKENS:
        return (head + f"the 6M-token target is reached ({learnt:,} tokens before loops) with "
                f"{answered:,} of its\n{num_prompts:,} prompts answered; the other "
                f"{num_prompts - answered:,} would take about "
                f"{(num_prompts - answered) / rate / 3600:.1f} more hours of this CPU at {rate} "
                f"prompts per second.")
    return (head + f"the 6M-token target needs about {round(needed, -2):,.0f} of its "
            f"{num_prompts:,} prompts\nanswered, some {round(left, -2):,.0f} more: about "
            f"{left / rate / 3600:.1f} more hours of this CPU at {rate} prompts per second.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--rate", type=float, default=1.25,
                        help="prompts per second of the answer run, for the estimate")
    args = parser.parse_args()
    records = read_records(args.data)
    num_prompts = sum(1 for _ in json_lines(args.data / "prompts.jsonl.gz"))
    rows = phase_rows(records)
    notes = args.data / "ANSWERS.md"
    progress = table(rows, len(records))
    guess = estimate(rows, num_prompts, args.rate)
    # Functions as replacements: the new text is inserted as it is, never read as a template.
    text, n_table = re.subn(r"\| records \|.*?\n(?=\n)", lambda _: progress + "\n",
                            notes.read_text(), count=1, flags=re.S)
    text, n_est = re.subn(r"About \d+ answer tokens per prompt.*?CPU[^\n]*\.", lambda _: guess,
                          text, count=1, flags=re.S)
    if not (n_table and n_est):
        raise SystemExit(f"{notes}: the progress table or the estimate was not found")
    notes.write_text(text)
    print(progress)


if __name__ == "__main__":
    main()
