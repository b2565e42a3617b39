"""The adapter's compiled n-gram lookup finds what the core's numpy lookup finds.

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


def test_compiled_lookup_matches_the_core_on_random_histories():
    out = _run("""
        import json
        import numpy as np
        from dflash_plugin.ngram import find_ngram_draft as numpy_find
        from vllm_ext import ngram_kernel

        def same(a, b):
            if a is None or b is None:
                return a is b
            return a.ngram == b.ngram and np.array_equal(a.tokens, b.tokens)

        rng = np.random.default_rng(7)
        found, differ = 0, []
        for dtype in (np.int32, np.int64):
            for trial in range(3000):
                vocab = int(rng.choice([2, 3, 5, 20, 400]))
                history = rng.integers(0, vocab, size=int(rng.integers(1, 120))).astype(dtype)
                min_n = int(rng.integers(1, 4))
                max_n = min_n + int(rng.integers(0, 4))
                k = int(rng.integers(0, 17))
                want = numpy_find(history, k, min_n, max_n)
                if not same(want, ngram_kernel.find_ngram_draft(history, k, min_n, max_n)):
                    differ.append([history.tolist(), k, min_n, max_n])
                found += want is not None
        print(json.dumps({"found": found, "differ": differ[:3]}))
    """)
    assert out["differ"] == []
    assert out["found"] > 2000  # the comparison covered matches, not only misses


def test_latest_longest_occurrence_and_its_overlapping_copy():
    out = _run("""
        import json
        import numpy as np
        from vllm_ext import ngram_kernel

        find = ngram_kernel.find_ngram_draft
        show = lambda m: None if m is None else [m.ngram, m.tokens.tolist()]
        try:
            find(np.array([1, 2, 1, 2]), 2, min_n=3, max_n=2)
            bad = None
        except ValueError as err:
            bad = str(err)
        print(json.dumps({
            "twice": show(find(np.array([7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9]), 5)),
            "repeat": show(find(np.array([9, 1, 2, 1, 2]), 4)),
            "none": show(find(np.array([1, 2, 3, 4]), 4)),
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
        import numpy as np
        os.environ["DFLASH_NGRAM_DRAFTS"] = "on"
        from dflash_plugin.draft_policy import DraftPolicy, PolicyMode, vllm_cpu_fp32_costs
        from vllm_ext import ngram_kernel
        from vllm_ext.ngram_drafts import start

        drafts = start(DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(7), 6))
        match = drafts.find([np.array([5, 6, 7, 8, 5, 6, 7]), None], 3)
        print(json.dumps({"compiled": drafts.finder is ngram_kernel.find_ngram_draft,
                          "tokens": match[0].tokens.tolist(), "second": match[1]}))
    """)
    assert out == {"compiled": True, "tokens": [8, 5, 6], "second": None}
