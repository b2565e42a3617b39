"""The prompts stage with the real-source generator: build, hold out a split, write files."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from dflash_plugin.train.prompts import Prompt, write_jsonl
from dflash_plugin.train.sources.builder import (
    MAX_SHARE,
    MAX_USES,
    BuildReport,
    build_real_prompts,
)
from dflash_plugin.train.sources.contamination import EvalIndex, find_eval_files, word_ngrams

PROVENANCE = (
    "Prompts built by dflash_plugin/train/sources from text and code shipped in Debian "
    "packages (downloaded with apt-get download, never installed) and from seeded maths and "
    "reasoning generators; prompts_report.json names every package, its version and licence. "
    "Each prompt records its source and task family. No source or task family gives more than "
    "5% of the prompts; near-duplicates (MinHash over word 5-grams) and any prompt sharing a "
    "word 8-gram with, or closely resembling, an evaluation prompts file of the repository "
    "are dropped."
)


SHARED_MATERIAL_NGRAM = 20


def default_eval_root() -> Path:
    """The repository holding this package when it runs from a checkout, else the cwd."""
    repo = Path(__file__).resolve().parents[3]
    return repo if (repo / "train_data").is_dir() else Path.cwd()


def split_held_out(prompts: list[Prompt], per_category: int, seed: int = 0
                   ) -> tuple[list[Prompt], list[Prompt], int]:
    """(train, held_out, dropped): per_category held-out prompts per category, and the
    training prompts that share the same passage or code with any of them (under another task)
    dropped. Shared material shows as a word 20-gram found in at most MAX_USES prompts; a
    20-gram found in more is a task phrasing, shared by design."""
    if per_category < 0:
        raise ValueError(f"per_category must be >= 0, got {per_category}")
    rng = random.Random(f"dflash-real-split:{seed}")
    held_ids: set[str] = set()
    for category in sorted({p.category for p in prompts}):
        ids = sorted(p.id for p in prompts if p.category == category)
        rng.shuffle(ids)
        held_ids.update(ids[:per_category])
    held = [p for p in prompts if p.id in held_ids]
    n = SHARED_MATERIAL_NGRAM
    held_grams = set().union(*(word_ngrams(p.text, n) for p in held)) if held else set()
    grams = {p.id: word_ngrams(p.text, n) & held_grams for p in prompts}
    df = Counter(g for found in grams.values() for g in found)
    material = {g for g, count in df.items() if count <= MAX_USES}
    train = [p for p in prompts if p.id not in held_ids and not grams[p.id] & material]
    return train, held, len(prompts) - len(held) - len(train)


def build_prompt_files(out_dir: str | Path, *, num_prompts: int, sources: list[str] | None = None,
                       seed: int = 0, eval_per_category: int = 20, fetch: bool = True,
                       eval_root: Path | None = None, train_name: str = "prompts_train.jsonl",
                       eval_name: str = "prompts_eval.jsonl",
                       report_name: str = "prompts_report.json") -> dict:
    """Build the set into out_dir (train split, held-out split, report); returns the report."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eval_files = find_eval_files(eval_root or default_eval_root(), exclude=(out_dir,))
    # The cap applies to the training split: leave room for the held-out prompts and the
    # training prompts dropped for overlapping them (about as many again).
    reserve = 2 * eval_per_category * 9
    share = MAX_SHARE * max(0.5, (num_prompts - reserve) / num_prompts)
    prompts, report = build_real_prompts(num_prompts, sources=sources, seed=seed, fetch=fetch,
                                         eval_files=eval_files, max_share=share)
    train, held, dropped = split_held_out(prompts, eval_per_category, seed=seed)
    remaining = 0
    if eval_files:
        index = EvalIndex.from_files(eval_files)
        remaining = sum(index.hits(p.text) for p in train + held)
    write_jsonl(out_dir / train_name, train)
    write_jsonl(out_dir / eval_name, held)
    (out_dir / "PROVENANCE.txt").write_text(PROVENANCE + "\n")
    result = summary(report, train, held, dropped, remaining, eval_root or default_eval_root())
    result["seed"] = seed
    (out_dir / report_name).write_text(json.dumps(result, indent=1) + "\n")
    return result


def summary(report: BuildReport, train: list[Prompt], held: list[Prompt], dropped: int,
            remaining: int, root: Path) -> dict:
    d = report.as_dict()
    d["eval_files"] = [str(Path(p).resolve().relative_to(root.resolve()))
                       if Path(p).resolve().is_relative_to(root.resolve()) else str(p)
                       for p in d["eval_files"]]
    n = len(train)
    d.update(train_prompts=n, held_out_prompts=len(held), dropped_overlapping_held_out=dropped,
             eval_overlaps_remaining=remaining,
             train_by_category=dict(sorted(Counter(p.category for p in train).items())),
             train_by_source=dict(sorted(Counter(p.source for p in train).items())),
             train_by_task=dict(sorted(Counter(p.task for p in train).items())),
             train_followups=sum(p.followup is not None for p in train),
             max_source_share=round(max(Counter(p.source for p in train).values()) / n, 4),
             max_task_share=round(max(Counter(p.task for p in train).values()) / n, 4))
    return d
