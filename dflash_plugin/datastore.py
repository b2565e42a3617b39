"""Drafts retrieved from a datastore of the target's own answers (REST-style retrieval).

The shipped drafter misses common continuations that the target writes with near certainty on
real prompts ("a person's quality" -> " of"), because it learnt English from too few answers
(docs/history.md, "What the drafter misses on real prompts"). The target's answers to the
training prompts hold those phrases: indexed by their n-grams, they give for a history ending in
an n-gram the continuation that most often followed it there, with no training at all.

- `AnswerDatastore.build`: every n-gram (n in `ngram_sizes`) of the answers, with the
  occurrence whose next token is the most common one after it, and how often that token came.
- `AnswerDatastore.continuation`: for a history, the longest indexed n-gram that ends it and
  the tokens that followed it (`DatastoreMatch`), or None; `draft`: those tokens where the
  match is long and common enough to be worth verifying.
- `AnswerDatastore.drafts`: `draft` for a whole batch of history tails at once (what a serving
  engine asks every step), in a few numpy calls whatever the batch.
- `load_answers_datastore`: built from answer files (.jsonl / .jsonl.gz, read up to their
  loops) or loaded from a saved .npz.
- `save` / `load`: one .npz file.

Lossless either way: the target verifies whatever is drafted. Keys are 64-bit polynomial hashes
of the n-gram; a collision only proposes a wrong draft, which verification rejects.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dflash_plugin.errors import DFlashError

NGRAM_SIZES = (5, 4, 3, 2)
CONTINUATION = 15  # a 16-token block's drafted positions
# What `draft` proposes: an n-gram of 3+ tokens that went on with this token at least half the
# time (on the 96 OOD answers, replayed: 2.52 for lookup, else this, else the chain, against
# 2.36 without it; docs/history.md).
DRAFT_MIN_NGRAM = 3
DRAFT_MIN_SHARE = 0.5
_BASE = np.int64(1_000_003)  # odd: multiplying by it mod 2**64 keeps every token's bits
_SEPARATOR = -1  # between answers: no n-gram or continuation crosses it


@dataclass(frozen=True)
class DatastoreMatch:
    """The continuation that followed the `ngram`-token suffix of the history in the answers;
    `share` of that suffix's occurrences went on with its first token, out of `count`."""

    tokens: np.ndarray
    ngram: int
    share: float
    count: int


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of every n-gram of `tokens` (index i: tokens[i:i + n]); -1 entries never match."""
    h = np.zeros(tokens.shape[0] - n + 1, dtype=np.int64)
    with np.errstate(over="ignore"):
        for i in range(n):
            h = h * _BASE + (tokens[i:tokens.shape[0] - n + 1 + i] + 2)
    return h


def _hash(tokens: Sequence[int]) -> np.int64:
    return _hashes(np.asarray(tokens, dtype=np.int64), len(tokens))[0]


class AnswerDatastore:
    def __init__(self, corpus: np.ndarray, index: dict[int, tuple[np.ndarray, ...]],
                 continuation: int = CONTINUATION):
        self.corpus = corpus
        self.index = index  # n -> (sorted keys, continuation start, count of its token, total)
        self.length = continuation

    @classmethod
    def build(cls, answers: Iterable[Sequence[int]], ngram_sizes: Sequence[int] = NGRAM_SIZES,
              continuation: int = CONTINUATION) -> "AnswerDatastore":
        pieces = []
        for answer in answers:
            pieces += [np.asarray(answer, dtype=np.int64), np.array([_SEPARATOR])]
        if not pieces:
            raise ValueError("no answers to index")
        corpus = np.concatenate(pieces)
        index = {}
        for n in sorted(set(ngram_sizes), reverse=True):
            if n < 1:
                raise ValueError(f"n-gram sizes must be positive, got {n}")
            if corpus.shape[0] <= n:
                continue
            keys = _hashes(corpus, n)[:-1]  # every n-gram with a token after it
            start = np.arange(keys.shape[0]) + n
            nxt = corpus[start]
            window = np.lib.stride_tricks.sliding_window_view(corpus, n)[:keys.shape[0]]
            usable = (window != _SEPARATOR).all(axis=1) & (nxt != _SEPARATOR)
            keys, start, nxt = keys[usable], start[usable], nxt[usable]
            if keys.shape[0] == 0:
                continue
            # Count each (n-gram, next token) pair, then keep per n-gram its most common pair.
            order = np.lexsort((start, nxt, keys))
            keys, start, nxt = keys[order], start[order], nxt[order]
            new_pair = np.r_[True, (keys[1:] != keys[:-1]) | (nxt[1:] != nxt[:-1])]
            first = np.flatnonzero(new_pair)
            pair_count = np.diff(np.r_[first, keys.shape[0]])
            pair_key, pair_start = keys[first], start[first]
            best = np.lexsort((-pair_count, pair_key))
            new_key = np.r_[True, pair_key[best][1:] != pair_key[best][:-1]]
            totals = np.add.reduceat(pair_count[best], np.flatnonzero(new_key))
            chosen = best[new_key]
            index[n] = (pair_key[chosen], pair_start[chosen], pair_count[chosen], totals)
        return cls(corpus, index, continuation)

    def continuation(self, history: Sequence[int], length: int | None = None,
                     min_ngram: int = 1) -> DatastoreMatch | None:
        """The continuation of the longest indexed n-gram (at least `min_ngram` tokens) that
        ends `history`, up to `length` tokens and never past the end of its answer."""
        history = np.asarray(history, dtype=np.int64)
        length = self.length if length is None else length
        for n, (keys, starts, counts, totals) in self.index.items():
            if n < min_ngram or history.shape[0] < n:
                continue
            key = _hash(history[-n:])
            i = int(np.searchsorted(keys, key))
            if i == keys.shape[0] or keys[i] != key:
                continue
            tokens = self.corpus[starts[i]:starts[i] + length]
            stop = np.flatnonzero(tokens == _SEPARATOR)
            tokens = tokens[:stop[0]] if stop.size else tokens
            return DatastoreMatch(tokens.copy(), n, float(counts[i] / totals[i]), int(totals[i]))
        return None

    def draft(self, history: Sequence[int], length: int | None = None) -> list[int]:
        """The continuation worth drafting for this history ([] where none is)."""
        match = self.continuation(history, length, min_ngram=DRAFT_MIN_NGRAM)
        return match.tokens.tolist() if match and match.share >= DRAFT_MIN_SHARE else []

    def drafts(self, tails: np.ndarray, sizes: np.ndarray,
               length: int | None = None) -> list[DatastoreMatch | None]:
        """`draft` for a batch: `tails` [B, W] holds each history's last W tokens right-aligned,
        `sizes` [B] how many of them are real (the rest is padding). Per row, the match `draft`
        would verify (the longest indexed n-gram of DRAFT_MIN_NGRAM+ tokens, if its token came at
        least DRAFT_MIN_SHARE of the time), or None."""
        tails = np.asarray(tails, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        length = self.length if length is None else length
        batch, width = tails.shape
        found: list[DatastoreMatch | None] = [None] * batch
        open_rows = np.ones(batch, dtype=bool)
        for n, (keys, starts, counts, totals) in self.index.items():
            if n < DRAFT_MIN_NGRAM or n > width or keys.shape[0] == 0:
                continue
            rows = np.flatnonzero(open_rows & (sizes >= n))
            if rows.size == 0:
                continue
            key = np.zeros(rows.size, dtype=np.int64)
            with np.errstate(over="ignore"):
                for column in range(width - n, width):  # the same hash as `_hashes`
                    key = key * _BASE + (tails[rows, column] + 2)
            at = np.minimum(np.searchsorted(keys, key), keys.shape[0] - 1)
            hit = keys[at] == key
            for row, i in zip(rows[hit].tolist(), at[hit].tolist()):
                open_rows[row] = False  # the longest match decides, as in `draft`
                if counts[i] < DRAFT_MIN_SHARE * totals[i]:
                    continue
                tokens = self.corpus[starts[i]:starts[i] + length]
                stop = np.flatnonzero(tokens == _SEPARATOR)
                tokens = tokens[:stop[0]] if stop.size else tokens
                if tokens.size:
                    found[row] = DatastoreMatch(tokens.copy(), n, float(counts[i] / totals[i]),
                                                int(totals[i]))
        return found

    @property
    def max_ngram(self) -> int:
        """The longest indexed n-gram: how much of each history `drafts` reads."""
        return max(self.index, default=0)

    def save(self, path: str | Path):
        arrays = {"corpus": self.corpus, "continuation": np.array(self.length)}
        for n, parts in self.index.items():
            for name, array in zip(("keys", "starts", "counts", "totals"), parts):
                arrays[f"{name}_{n}"] = array
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "AnswerDatastore":
        with np.load(path) as data:
            sizes = sorted({int(k.split("_")[1]) for k in data.files if k.startswith("keys_")},
                           reverse=True)
            index = {n: tuple(data[f"{name}_{n}"] for name in ("keys", "starts", "counts",
                                                                "totals"))
                     for n in sizes}
            return cls(data["corpus"], index, int(data["continuation"]))


def load_answers_datastore(paths: Sequence[str | Path],
                           cache_dir: str | Path | None = None) -> AnswerDatastore:
    """A saved datastore (one .npz), or one built from answer files (the responses stage's
    records: `response_ids`, read up to where they start looping). With a `cache_dir`, one
    built from answer files is saved there and loaded again while the files stay the same
    (building from 9.5M tokens takes about 20 s, loading the .npz about 2 s)."""
    paths = [Path(p) for p in paths]
    if len(paths) == 1 and paths[0].suffix == ".npz":
        return AnswerDatastore.load(paths[0])
    if cache_dir is None:
        return _build_from_answer_files(paths)
    cached = Path(cache_dir) / f"answers-{_files_key(paths)}.npz"
    if cached.is_file():
        try:
            return AnswerDatastore.load(cached)
        except (OSError, ValueError, KeyError):  # a damaged cache is rebuilt
            pass
    datastore = _build_from_answer_files(paths)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial.npz")
    datastore.save(partial)
    partial.replace(cached)
    return datastore


def _files_key(paths: Sequence[Path]) -> str:
    """Names the answer files as they are now: path, size and modification time of each."""
    digest = hashlib.sha256(f"v1 {NGRAM_SIZES} {CONTINUATION}".encode())
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.resolve()} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _build_from_answer_files(paths: Sequence[Path]) -> AnswerDatastore:
    from dflash_plugin.train.repeats import trim_loop

    def answers():
        for path in paths:
            with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield trim_loop(json.loads(line)["response_ids"])
                    except (ValueError, KeyError, TypeError) as err:
                        raise DFlashError(f"{path} line {number}: not an answer record with "
                                          f"response_ids (the responses stage's files): "
                                          f"{err}") from None

    return AnswerDatastore.build(answers())
