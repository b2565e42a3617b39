"""The core's n-gram lookup (dflash_plugin.ngram.find_ngram_draft), compiled with numba.

The core's numpy search spends about 30 us a request on numpy call overheads for a history of a
few hundred tokens; at 16-32 requests that was 0.77 ms of every step under load
(docs/benchmarks.md, "Served per step, servers resident"). numba comes with vLLM (its own n-gram
proposer is compiled with it), so the adapter compiles the same search: the same match and the
same tokens (tests/vllm/test_ngram_kernel.py). It is imported when the drafter is built, after
the worker's CPU kernel-override scan, which fails on numba's objects once numba is loaded.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from dflash_plugin.ngram import find_ngram_draft as core_find


@njit(cache=True, nogil=True)
def _longest_match(tokens, max_n):
    """As dflash_plugin.ngram.longest_match, compiled."""
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


def _compiled_longest(tokens: np.ndarray, max_n: int) -> tuple[int, int]:
    best, end = _longest_match(np.ascontiguousarray(tokens), max_n)
    return int(best), int(end)


# dflash_plugin.ngram.find_ngram_draft with the compiled search
find_ngram_draft = functools.partial(core_find, longest=_compiled_longest)


def warm_up():
    """Compile (or load from numba's cache) for the history dtypes the runner hands in, so that
    the first served step does not pay for it."""
    for dtype in (np.int32, np.int64):
        find_ngram_draft(np.array([1, 2, 3, 1, 2], dtype=dtype), 2)
