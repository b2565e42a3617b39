"""Per-step cost of the vLLM adapter's prompt lookup at 16 and 32 requests, three ways: each
request's history built and searched with the core's numpy code; the same histories searched by
the compiled search one request at a time; one compiled call for the step over the runner's
token rows (vllm_ext.ngram_kernel, what the adapter runs). Synthetic rows of 150-600 tokens drawn
from a Zipf law, so that the last token recurs as in text.

    python tools/bench_step_lookup.py
"""

import json
import time
from types import SimpleNamespace

import numpy as np
import torch

from dflash_plugin.ngram import find_ngram_draft
from vllm_ext import ngram_drafts, ngram_kernel


def per_request_compiled(history, k, min_n=2, max_n=4):
    """find_ngram_draft's result with the kernel's search, one history at a time."""
    size = history.shape[0]
    if size <= min_n:
        return None
    best, end = ngram_kernel._longest_match(history.astype(np.int64), max_n)
    if best < min_n:
        return None
    return history[end + 1 + np.arange(k) % (size - end - 1)]


def main(repeats: int = 300):
    ngram_kernel.warm_up()
    ngram_drafts._kernel = ngram_kernel  # as ngram_drafts.start() sets it in the worker
    rng = np.random.default_rng(0)
    words = np.minimum(rng.zipf(1.3, size=10**6), 49151)
    result = {}
    for batch in (16, 32):
        token_ids = np.zeros((256, 1024), dtype=np.int32)
        lengths = rng.integers(150, 600, size=256)
        for i in range(256):
            token_ids[i, :lengths[i]] = rng.choice(words, size=lengths[i])
        sampled = torch.tensor(rng.choice(words, size=(batch, 16)), dtype=torch.int32)
        sampled[:, 1:] = -1  # one token sampled per request, as on a draft-free step
        record = (SimpleNamespace(token_ids_cpu=token_ids, num_tokens_no_spec=lengths,
                                  vocab_size=49152), sampled, torch.zeros(256, dtype=torch.bool))
        ways = {
            "histories, numpy search": lambda: [
                None if h is None else find_ngram_draft(h, 15)
                for h in ngram_drafts.histories(record, batch)],
            "histories, compiled search per request": lambda: [
                None if h is None else per_request_compiled(h, 15)
                for h in ngram_drafts.histories(record, batch)],
            "one compiled call per step": lambda: ngram_drafts.step_matches(record, batch, 15),
        }
        row = {}
        for name, way in ways.items():
            way()
            began = time.perf_counter()
            for _ in range(repeats):
                way()
            row[name] = round((time.perf_counter() - began) / repeats * 1e3, 3)
        result[f"{batch} requests, ms"] = row
    print(json.dumps(result))


if __name__ == "__main__":
    main()
