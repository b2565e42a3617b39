"""The adapter's compiled step lookup finds what the core's numpy lookup finds in the histories
the adapter builds.

Each check runs in a child process: once numba is imported, vLLM's CPU kernel-override scan
(`register_triton_kernel_overrides`, which other tests here call, as the worker does before it
builds the drafter) trips over numba's objects, so this suite keeps numba out of its own process.
"""

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba comes with vLLM")


def _run(script: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_compiled_step_lookup_matches_the_core_on_random_steps():
    out = _run("""
        import json
        from types import SimpleNamespace
        import numpy as np
        import torch
        from vllm_ext import ngram_drafts, ngram_kernel

        def same(a, b):
            if a is None or b is None:
                return a is b
            return a.ngram == b.ngram and np.array_equal(a.tokens, b.tokens)

        rng = np.random.default_rng(7)
        found = histories = steps = 0
        differ = []
        for dtype in (np.int32, np.int64):
            for trial in range(400):
                batch, width = int(rng.integers(1, 33)), int(rng.integers(1, 17))
                vocab = int(rng.choice([2, 3, 5, 20, 400]))
                token_ids = rng.integers(0, vocab, size=(batch + 2, 160)).astype(dtype)
                lengths = rng.integers(0, 140, size=batch + 2)
                sampled = rng.integers(-1, vocab + 1, size=(batch, width))  # -1, vocab: invalid
                sampled[rng.random((batch, width)) < 0.3] = -1
                record = (SimpleNamespace(token_ids_cpu=token_ids, num_tokens_no_spec=lengths,
                                          vocab_size=int(rng.choice([0, vocab]))),
                          torch.tensor(sampled, dtype=rng.choice([torch.int32, torch.int64])),
                          torch.tensor(rng.random(batch + 1) < 0.2))
                min_n = int(rng.integers(1, 4))
                max_n = min_n + int(rng.integers(0, 4))
                k = int(rng.integers(0, 17))
                ngram_drafts._kernel = None
                want = ngram_drafts.step_matches(record, batch, k, min_n, max_n)
                histories += sum(h is not None for h in ngram_drafts.histories(record, batch))
                ngram_drafts._kernel = ngram_kernel
                got = ngram_drafts.step_matches(record, batch, k, min_n, max_n)
                steps += 1
                found += sum(m is not None for m in want)
                if len(got) != batch or not all(map(same, want, got)):
                    differ.append([trial, str(dtype)])
        print(json.dumps({"steps": steps, "histories": histories, "found": found,
                          "differ": differ[:3]}))
    """)
    assert out["differ"] == []
    assert out["steps"] == 800
    assert out["found"] > 2000  # the comparison covered matches, not only misses
    assert out["histories"] > out["found"]  # ... and histories without one


def test_latest_longest_occurrence_and_its_overlapping_copy():
    out = _run("""
        import json
        from types import SimpleNamespace
        import numpy as np
        import torch
        from vllm_ext import ngram_drafts, ngram_kernel

        ngram_drafts._kernel = ngram_kernel

        def find(history, k, **lengths):
            # the last token arrives as this step's sampled one
            record = (SimpleNamespace(token_ids_cpu=np.array([history[:-1]], dtype=np.int32),
                                      num_tokens_no_spec=np.array([len(history) - 1]),
                                      vocab_size=100),
                      torch.tensor([[history[-1], -1]]), torch.tensor([False]))
            match = ngram_drafts.step_matches(record, 1, k, **lengths)[0]
            return None if match is None else [match.ngram, match.tokens.tolist()]

        try:
            find([1, 2, 1, 2], 2, min_n=3, max_n=2)
            bad = None
        except ValueError as err:
            bad = str(err)
        print(json.dumps({
            "twice": find([7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9], 5),
            "repeat": find([9, 1, 2, 1, 2], 4),
            "none": find([1, 2, 3, 4], 4),
            "bad": bad}))
    """)
    assert out["twice"] == [3, [4, 5, 6, 7, 8]]  # the latest of two earlier "7 8 9"
    assert out["repeat"] == [2, [1, 2, 1, 2]]  # "x a b a b" goes on as the repeat
    assert out["none"] is None
    assert "min_n" in out["bad"]


def test_the_adapter_looks_up_with_the_compiled_search():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM")
    out = _run("""
        import json, os
        os.environ["DFLASH_NGRAM_DRAFTS"] = "on"
        from dflash_plugin.draft_policy import DraftPolicy, PolicyMode, vllm_cpu_fp32_costs
        from vllm_ext import ngram_drafts, ngram_kernel

        before = ngram_drafts._kernel
        drafts = ngram_drafts.start(DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(7), 6))
        print(json.dumps({"before": before is None,
                          "compiled": ngram_drafts._kernel is ngram_kernel,
                          "lengths": [drafts.min_n, drafts.max_n]}))
    """)
    assert out == {"before": True, "compiled": True, "lengths": [2, 4]}
