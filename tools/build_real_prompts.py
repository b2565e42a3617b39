"""Build the committed real-source prompt set and its data card.

Writes OUT/prompts.jsonl.gz (training prompts), OUT/eval_prompts.jsonl (held-out prompts from
the same builder), OUT/prompts_report.json and OUT/README.md (the data card, generated from the
report). The Debian packages are fetched into $DFLASH_HOME/sources on first use:

    .venv/bin/python tools/build_real_prompts.py --out train_data/smollm2-135m-real

The same builder is the default of `dflash train --stages prompts`. `--card-only` rewrites
the data card from the existing report (after an answer run has written its summary).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash_plugin.train.sources.stage import build_prompt_files

ROOT = Path(__file__).resolve().parent.parent

CARD_HEAD = """# Real-source training prompts (SmolLM2-135M-Instruct)

Training prompts for a DFlash drafter, built from English text and code that Debian ships
(fetched with `apt-get download`, unpacked, never installed) and from seeded maths and
reasoning generators, by `dflash_plugin/train/sources` (`tools/build_real_prompts.py`, or
`dflash train --stages prompts`, whose default generator this is). They replace the template
generator of `dflash_plugin/train/prompts.py` (3,600 prompts from seed lists), whose held-out
split measured how well a drafter learned that generator rather than real requests.

Files:

- `prompts.jsonl.gz`: the training prompts, one JSON object per line: `id`, `category`,
  `prompt`, `source` (the builder's source name; the table below gives its package), `task`
  (the task family that phrased it) and, for about 15%, `followup`: a second user message to
  ask on the target's own first answer.
- `eval_prompts.jsonl`: prompts held out from the same build (in-distribution). Training
  prompts sharing a word 20-gram with one of them (the same passage or code under another
  task) were dropped.
- `prompts_report.json`: every count below, machine-readable.

Out-of-distribution evaluation lives in `train_data/eval/` (hand-written user prompts and
HumanEval); none of it is used here.

## How a prompt is made

A source reader turns a package into *materials*: a word with its gloss, a passage of 80-320
words, a function (from which a one-token bug may be planted), a man page's NAME line, an FAQ
question, a compiler error example, a country and its capital, ... A task family (45 of them,
in `tasks.py`, plus 27 maths and reasoning generators) says what a user asks about one kind of
material and has several phrasings; the builder picks one at random, sometimes roughens it the
way people type (lower-case start, a greeting, a dropped question mark, an occasional swapped
letter) and sometimes adds a follow-up. Sources are visited round-robin, a material serves at
most three families, and each pick takes the less-used of two fitting families.

Checks, in order, on every candidate: at most 3,000 characters (a prompt plus a 1,024-token
answer fits a 2,048-token context); not an exact duplicate; not closely resembling an
evaluation prompt (MinHash estimate of word 5-gram Jaccard >= 0.5: the same template with
other numbers); no word 8-gram shared with an evaluation prompt; not a near-duplicate of a
kept prompt (datasketch MinHash LSH, 128 permutations, word 5-grams, Jaccard >= 0.8). No source
and no task family may give more than 5% of the training prompts, and no category more than
25% (the documentation sources are mostly about programming).
"""

CARD_LIMITS = """
## Known limits

- Task phrasings and the maths/reasoning generators were written by hand for this project, by
  the same author as `train_data/eval/ood_user_prompts.jsonl` (written first). Exact and close
  template overlaps with every evaluation file are removed (the counts above), but the
  generators cover some of the same *kinds* of problem (ordering puzzles, unit conversions,
  code fixes), so out-of-distribution results on maths and reasoning may read a little high.
- Passages keep their sources' era and register: Austen, the World English Bible, the
  Devil's Dictionary (1911) and the Jargon File are old or satirical; Python 3.11, Go 1.19,
  Rust 1.63, Node 18, Perl 5.36 and SQLite 3.40 docs describe those versions.
- Licences: most verbatim passages are public domain or permissive. GPL or GFDL text appears
  verbatim in prompts from miscfiles (tables), debian-reference (GPL-2+), perl-doc (GPL or
  Artistic), git-man (GPL-2), dict-foldoc and dict-vera (GFDL) and some man pages; keep this
  card with the data if it is redistributed.
- The category mix follows the sources, not real traffic: little everyday chat.
"""


def _table(counts: dict, total: int, header: str) -> str:
    rows = [f"| {header} | prompts | share |", "|---|---:|---:|"]
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        rows.append(f"| {key} | {n:,} | {100 * n / total:.1f}% |")
    return "\n".join(rows)


def render_card(r: dict, out_dir: Path) -> str:
    n = r["train_prompts"]
    src_rows = ["| source | package | version | licence | prompts | share |",
                "|---|---|---|---|---:|---:|"]
    for name, info in sorted(r["sources"].items()):
        k = r["train_by_source"].get(name, 0)
        src_rows.append(f"| {name} | {info['package']} | {info['version']} | {info['licence']} "
                        f"| {k:,} | {100 * k / n:.1f}% |")
    checks = [
        f"- Candidates examined: {r['candidates']:,}; kept {r['train_prompts'] + r['held_out_prompts'] + r['dropped_overlapping_held_out']:,}.",
        f"- Exact duplicates dropped: {r['exact_duplicates']:,}; near-duplicates dropped: "
        f"{r['near_duplicates']:,}. Duplicate rate {100 * r['duplicate_rate']:.2f}% of "
        f"candidates.",
        f"- Evaluation overlap: {r['contaminated']:,} candidates shared a word 8-gram and "
        f"{r['resembling_eval']:,} closely resembled an evaluation prompt; all were dropped. "
        f"Word 8-gram hits remaining in the training and held-out prompts: "
        f"**{r['eval_overlaps_remaining']}**.",
        "- Evaluation files checked: " + ", ".join(f"`{f}`" for f in r["eval_files"]) + " "
        "(every `*prompts*.jsonl` in the repository except training splits and this "
        "builder's own held-out splits).",
        f"- Too long (over 3,000 characters): {r['too_long']:,}.",
        f"- Held out: {r['held_out_prompts']} prompts; training prompts dropped for sharing a "
        f"passage with them: {r['dropped_overlapping_held_out']:,}.",
        f"- Largest share of one source: {100 * r['max_source_share']:.2f}%; of one task "
        f"family: {100 * r['max_task_share']:.2f}%.",
        f"- Prompts with a follow-up turn: {r['train_followups']:,} "
        f"({100 * r['train_followups'] / n:.1f}%).",
    ]
    examples = "\n".join(f"  - {e['source']} / {e['task']}: \"{e['shared']}\""
                         for e in r["contamination_examples"][:6])
    return "\n".join([
        CARD_HEAD,
        f"## Counts\n\n**{n:,} training prompts** (seed {r.get('seed', 0)}), "
        f"{r['held_out_prompts']} held out.\n",
        "### Sources\n", "\n".join(src_rows), "",
        "### Categories\n", _table(r["train_by_category"], n, "category"), "",
        "### Task families\n", _table(r["train_by_task"], n, "task"), "",
        "## Checks\n", "\n".join(checks), "",
        "Examples of shared 8-grams that were dropped:\n", examples, "",
        "## Answers\n", answers_section(out_dir), CARD_LIMITS,
    ])


def answers_section(out_dir: Path) -> str:
    """ANSWERS.md (the answer run's state, kept as it goes) or else a default line, then
    responses.summary.json (the full run) and answer_check.json (a small check run), whichever
    exist."""
    notes = out_dir / "ANSWERS.md"
    if notes.is_file():
        text = [notes.read_text().strip()]
    else:
        text = ["Answers come from `tools/answer_real_prompts.py`: the target's chat template, "
                "greedy, to EOS with a cap of 1,024 new tokens, each follow-up asked on the "
                "target's own first answer; saved chunk by chunk and resumable."]
    full = out_dir / "responses.summary.json"
    if full.is_file():
        s = json.loads(full.read_text())
        text.append(f"\nFull run: {s['records']:,} answers ({s['second_turns']:,} second "
                    f"turns), {s['answer_tokens']:,} answer tokens, mean "
                    f"{s['mean_answer_tokens']}, {s['answers_at_cap']:,} stopped at the cap.")
    elif not notes.is_file():
        text.append("\nThe full run has not been made yet.")
    check = out_dir / "answer_check.json"
    if check.is_file() and not notes.is_file():
        c = json.loads(check.read_text())
        text.append(
            f"\nCheck run ({c['what']}; {c['engine']}; {c['machine']}): {c['prompts']} prompts "
            f"and {c['second_turns']} follow-ups gave {c['answer_tokens']:,} answer tokens, mean "
            f"{c['mean_answer_tokens']}; {c['answers_at_cap']} of "
            f"{c['prompts'] + c['second_turns']} answers reached the {c['max_tokens']}-token cap "
            f"(mostly repetition loops); {c['tokens_per_second_generation']} tokens/s after an "
            f"engine start of {c['engine_start_seconds']} s.")
    return "\n".join(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "train_data" / "smollm2-135m-real")
    parser.add_argument("--num-prompts", type=int, default=32000)
    parser.add_argument("--eval-per-category", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", help="comma list (default: all)")
    parser.add_argument("--card-only", action="store_true",
                        help="only rewrite README.md from the existing prompts_report.json")
    args = parser.parse_args()
    if args.card_only:
        report = json.loads((args.out / "prompts_report.json").read_text())
        (args.out / "README.md").write_text(render_card(report, args.out))
        return
    report = build_prompt_files(
        args.out, num_prompts=args.num_prompts, seed=args.seed,
        sources=args.sources.split(",") if args.sources else None,
        eval_per_category=args.eval_per_category, eval_root=ROOT,
        train_name="prompts.jsonl.gz", eval_name="eval_prompts.jsonl")
    (args.out / "README.md").write_text(render_card(report, args.out))
    print(f"{report['train_prompts']} training prompts, {report['held_out_prompts']} held out "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
