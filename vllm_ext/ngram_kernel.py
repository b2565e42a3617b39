"""The core's n-gram lookup (dflash_plugin.ngram.find_ngram_draft) for a whole step, compiled
with numba.

Per request, the core's numpy search and the history it searches (the runner's tokens joined
with this step's accepted ones) cost about 20-30 us of numpy call overheads; at 16-32 requests
that was 0.3-0.8 ms of every step under load (docs/benchmarks.md, "Served per step, servers
resident"). numba comes with vLLM (its own n-gram proposer is compiled with it), so the adapter
runs the same search over the runner's arrays in one compiled call: the same matches and tokens
(tests/vllm/test_ngram_kernel.py). It is imported when the drafter is built, after the worker's
CPU kernel-override scan, which fails on numba's objects once numba is loaded.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _longest_match(tokens, max_n):
    """(n, end): the longest n <= max_n such that the history's last n tokens also end at an
    earlier position, and the latest such end (0, -1: the last token never occurred); the
    search of dflash_plugin.ngram.find_ngram_draft."""
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


@njit(cache=True, nogil=True)
def step_lookup(token_ids, lengths, sampled, discard, vocab, k, min_n, max_n, ngrams, tokens):
    """Per row i of this step: the history is token_ids[i, :lengths[i]] followed by sampled[i]
    up to its first invalid entry (< 0, or >= vocab when vocab > 0); no history where discard[i]
    or nothing valid was sampled. Writes find_ngram_draft's result: ngrams[i] the matched length
    (0: no match) and tokens[i, :k] the continuation."""
    batch, width = sampled.shape
    longest = 0
    for i in range(batch):
        longest = max(longest, lengths[i])
    history = np.empty(longest + width, dtype=np.int64)
    for i in range(batch):
        ngrams[i] = 0
        if discard[i]:
            continue
        valid = 0
        while valid < width and sampled[i, valid] >= 0 and (vocab <= 0
                                                            or sampled[i, valid] < vocab):
            valid += 1
        if valid == 0:
            continue
        size = lengths[i] + valid
        for j in range(lengths[i]):
            history[j] = token_ids[i, j]
        for j in range(valid):
            history[lengths[i] + j] = sampled[i, j]
        if k < 1 or size <= min_n:
            continue
        best, end = _longest_match(history[:size], max_n)
        if best < min_n:
            continue
        start = end + 1
        period = size - start  # > 0: the occurrence ends before the history does
        for t in range(k):
            tokens[i, t] = history[start + t % period]
        ngrams[i] = best


def warm_up():
    """Compile (or load from numba's cache) for the token dtypes the runner may hold, so that
    the first served step does not pay for it."""
    for dtype in (np.int32, np.int64):
        step_lookup(np.array([[1, 2, 3, 1]], dtype=dtype), np.array([4]),
                    np.array([[2, -1]]), np.zeros(1, dtype=np.bool_), 0, 2, 2, 4,
                    np.zeros(1, dtype=np.int64), np.zeros((1, 2), dtype=np.int64))
