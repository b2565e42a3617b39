"""Near-duplicate detection: MinHash signatures of word 5-grams in an LSH index (datasketch).

Two prompts whose 5-gram sets overlap with estimated Jaccard similarity at or above the
threshold count as near-duplicates; only the first one seen is kept.
"""

from __future__ import annotations

import re

from dflash_plugin.errors import DFlashError

SHINGLE = 5


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    if len(words) <= n:
        return {" ".join(words)}
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


class NearDuplicates:
    """Add texts one at a time; `add` says whether a text was new (and keeps it) or not."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, seed: int = 1):
        try:
            from datasketch import MinHash, MinHashLSH
        except ImportError as err:
            raise DFlashError("near-duplicate removal needs datasketch: "
                              "pip install 'dflash-plugin[train]'") from err
        self._minhash = MinHash
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._num_perm, self._seed, self._n = num_perm, seed, 0

    def signature(self, text: str):
        m = self._minhash(num_perm=self._num_perm, seed=self._seed)
        m.update_batch([s.encode() for s in shingles(text)])
        return m

    def duplicate_of(self, text: str, signature=None) -> list[str]:
        """Keys of kept texts this one nearly duplicates (empty if none)."""
        return self._lsh.query(signature if signature is not None else self.signature(text))

    def add(self, text: str, key: str | None = None, force: bool = False,
            signature=None) -> bool:
        """Keep text unless it nearly duplicates a kept one (force: keep it regardless).
        A signature computed by another index with the same settings may be passed in."""
        sig = signature if signature is not None else self.signature(text)
        if not force and self._lsh.query(sig):
            return False
        self._lsh.insert(key or f"t{self._n}", sig)
        self._n += 1
        return True
