"""The core's n-gram lookup (dflash_plugin.ngram.find_ngram_draft), compiled with numba.

The core's numpy search spends about 30 us a request on numpy call overheads for a history of a
few hundred tokens; at 16-32 requests that was 0.77 ms of every step under load
(docs/benchmarks.md, "Served per step, servers resident"). numba comes with vLLM (its own n-gram
proposer is compiled with it), so the adapter compiles the same search: the same match and the
same tokens (tests/vllm/test_ngram_kernel.py). It is imported when the drafter is built, after
the worker's CPU kernel-override scan, which fails on numba's objects once numba is loaded.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dflash_plugin.ngram import NGRAM_MAX, NGRAM_MIN, NgramMatch


@njit(cache=True, nogil=True)
def _longest_match(tokens, max_n):
    """(n, end): the longest n <= max_n such that the history's last n tokens also end at an
    earlier position, and the latest such end; (0, -1) when the last token never occurred."""
    size = tokens.shape[0]
    last = tokens[size - 1]
    best, best_end = 0, -1
    for end in range(size - 2, -1, -1):  # latest first: a later end wins a tie
        if tokens[end] != last:
            continue
        length = 1
        while length < max_n and length <= end \
                and tokens[end - length] == tokens[size - 1 - length]:
            length += 1
        if length > best:
            best, best_end = length, end
            if best == max_n:
                break
    return best, best_end


def find_ngram_draft(history: np.ndarray, k: int, min_n: int = NGRAM_MIN,
                     max_n: int = NGRAM_MAX) -> NgramMatch | None:
    """As dflash_plugin.ngram.find_ngram_draft, compiled."""
    if not 1 <= min_n <= max_n:
        raise ValueError(f"n-gram lengths need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    tokens = np.ascontiguousarray(history)
    size = tokens.shape[0]
    if k < 1 or size <= min_n:
        return None
    best, end = _longest_match(tokens, max_n)
    if best < min_n:
        return None
    start = end + 1
    period = size - start  # > 0: the occurrence ends before the history does
    return NgramMatch(tokens[start + np.arange(k) % period].copy(), int(best))


def warm_up():
    """Compile (or load from numba's cache) for the history dtypes the runner hands in, so that
    the first served step does not pay for it."""
    for dtype in (np.int32, np.int64):
        find_ngram_draft(np.array([1, 2, 3, 1, 2], dtype=dtype), 2)
