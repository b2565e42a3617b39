"""Training prompts must share no word 8-gram with any evaluation prompt in the repository.

Evaluation files are the `*prompts*.jsonl` files outside the training split (train_data/eval/,
each target's eval_prompts*.jsonl, the benchmark prompts); the builder's own held-out splits
are not among them. Each line may hold its text in
"text", "prompt" or a "turns" list; every turn counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dflash_plugin.prompt_io import json_lines

NGRAM = 8
_SKIP_DIRS = {".git", ".venv", ".venv-sglang", "node_modules", "__pycache__", "build", "dist"}


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _written_by_the_builder(path: Path) -> bool:
    """A held-out split of this builder (rows carry source and task): it shares task phrasings
    with every build by design, and its own build already kept its passages out of training."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(row, dict) and "source" in row and "task" in row
    return False


def find_eval_files(root: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Every *prompts*.jsonl under root that is not a training split, not a held-out split
    written by this builder, and not under `exclude`."""
    root = Path(root)
    excluded = [Path(e).resolve() for e in exclude]
    found = []
    for path in sorted(root.rglob("*prompts*.jsonl")):
        rel = path.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if "train" in path.name:
            continue
        resolved = path.resolve()
        if any(resolved == e or e in resolved.parents for e in excluded):
            continue
        if not _written_by_the_builder(path):
            found.append(path)
    return found


def eval_texts(path: Path) -> list[str]:
    out = []
    for _, _, row in json_lines(path):
        if not isinstance(row, dict):
            continue
        for key in ("text", "prompt", "followup"):
            if isinstance(row.get(key), str):
                out.append(row[key])
        if isinstance(row.get("turns"), list):
            out += [t for t in row["turns"] if isinstance(t, str)]
    return out


class EvalIndex:
    """The word n-grams of a set of evaluation texts; `hits` tests a training text for a
    shared n-gram, `resembles` for a paraphrase (same template, other numbers or names)."""

    def __init__(self, texts: list[str], n: int = NGRAM, similarity: float = 0.5):
        from dflash_plugin.train.sources.dedup import NearDuplicates

        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self._similar = NearDuplicates(threshold=similarity)
        for i, t in enumerate(texts):
            self.grams |= word_ngrams(t, n)
            self._similar.add(t, f"eval{i}", force=True)

    def resembles(self, text: str, signature=None) -> bool:
        """Estimated Jaccard similarity of word 5-grams with some evaluation text >= 0.5
        (signature: the text's MinHash from a NearDuplicates with default settings)."""
        return bool(self._similar.duplicate_of(text, signature))

    @classmethod
    def from_files(cls, paths: list[Path], n: int = NGRAM) -> "EvalIndex":
        texts = []
        for p in paths:
            texts += eval_texts(p)
        return cls(texts, n)

    def hits(self, text: str) -> bool:
        return not self.grams.isdisjoint(word_ngrams(text, self.n))

    def shared(self, text: str) -> list[str]:
        """The n-grams text shares with the evaluation files, as strings."""
        return sorted(" ".join(g) for g in word_ngrams(text, self.n) & self.grams)
