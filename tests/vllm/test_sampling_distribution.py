"""Sampling through the plugin is the target's distribution (issue 38).

N seeded requests at temperature 1 on one prompt, served by a plain engine and by the plugin's
DFlash (shipped drafter, the executor `dflash serve` uses, full draft blocks so every step after
the prefill verifies drafts through vLLM's rejection sampler). The 1st token comes from the
prefill; the 2nd..MAX_TOKENS-th went through the rejection sampler. For each of those positions a
two-sample chi-square test (plugin against plain) must pass. Then, in the same worker, the
acceptance rule is broken (every draft accepted: the output follows the drafter's greedy
drafts) and the same test must reject: the test has the power to see a wrong rule.

Threshold: p > ALPHA = 0.001 per position. Under the null each position's test fails with
probability 0.001, so the whole test fails falsely with probability <= 3 * 0.001 (the outputs
are also seeded, so a run repeats exactly).
"""

from __future__ import annotations

from collections import Counter

import pytest
from engine_helpers import engine as start_engine
from engine_helpers import environment, shipped_drafter

from dflash_cli.serving.flags import DRAFT_IDS_EXECUTOR

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

ENGINE_ARGS = dict(dtype="float32", max_model_len=256, seed=0, max_num_seqs=128,
                   kv_cache_memory_bytes=1 << 30, enforce_eager=True)
PROMPT = "My favorite animal is the"
N = 400
MAX_TOKENS = 4
K = 3
ALPHA = 1e-3
MIN_EXPECTED = 5  # categories with fewer expected counts (in either sample) are pooled


def sample(llm):
    from vllm import SamplingParams

    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=MAX_TOKENS,
                             ignore_eos=True) for i in range(N)]
    outputs = llm.generate([PROMPT] * N, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outputs]


def pooled_table(a: list, b: list) -> list[list[int]]:
    """The [outcome][sample] counts of two lists of outcomes, outcomes with fewer than
    MIN_EXPECTED expected counts pooled into one last row."""
    ca, cb = Counter(a), Counter(b)
    kept, pooled = [], [0, 0]
    for key in sorted(set(ca) | set(cb)):
        expected = min(len(a), len(b)) * (ca[key] + cb[key]) / (len(a) + len(b))
        if expected >= MIN_EXPECTED:
            kept.append([ca[key], cb[key]])
        else:
            pooled[0] += ca[key]
            pooled[1] += cb[key]
    if sum(pooled) > 0:
        kept.append(pooled)
    return kept


def chi_square_p(a: list, b: list) -> float:
    """Two-sample chi-square (homogeneity) p-value of two lists of outcomes."""
    from scipy.stats import chi2_contingency

    table = pooled_table(a, b)
    if len(table) < 2:
        return 1.0  # one category: nothing to tell apart
    return float(chi2_contingency(list(zip(*table)), correction=False).pvalue)


def position_p_values(a: list[tuple], b: list[tuple]) -> list[float]:
    """Per drafted position (2nd token on), the chi-square p-value of its marginal."""
    return [chi_square_p([s[pos] for s in a], [s[pos] for s in b])
            for pos in range(1, MAX_TOKENS)]


# Callables for the worker (collective_rpc), defined in a function so cloudpickle ships them by
# value.
def worker_calls():
    def accept_every_draft(worker):
        """A wrong acceptance rule: uniforms of 0 make the rejection kernel accept every draft
        (target_prob / draft_prob >= 0)."""
        import torch
        from vllm.v1.sample import rejection_sampler

        def zeros(num_tokens, num_draft_tokens, generators, device):
            return torch.zeros(num_tokens, dtype=torch.float64, device=device)

        rejection_sampler.generate_uniform_probs = zeros

    return dict(accept_every_draft=accept_every_draft)


@pytest.fixture(scope="module")
def samples(target_path, plain_llm):
    drafter = shipped_drafter()
    if drafter is None:
        pytest.fail("the shipped drafter is missing")
    calls = worker_calls()
    results = {}
    results["plain"] = sample(plain_llm)
    with environment(VLLM_ALLOW_INSECURE_SERIALIZATION="1", DFLASH_DRAFT_POLICY="full"), \
            start_engine(target_path, drafter, num_speculative_tokens=K,
                         distributed_executor_backend=DRAFT_IDS_EXECUTOR,
                         disable_log_stats=False, **ENGINE_ARGS) as llm:
        before = spec_counters(llm)
        results["plugin"] = sample(llm)
        after = spec_counters(llm)
        results["counts"] = {k: after[k] - before.get(k, 0) for k in after}
        llm.collective_rpc(calls["accept_every_draft"])
        results["wrong"] = sample(llm)
    return results


def spec_counters(llm):
    return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}


def test_the_prompt_spreads_the_drafted_positions(samples):
    # Several outcomes frequent enough to stand alone in the chi-square table at each tested
    # position (a sharply peaked position would leave the test little to compare).
    for pos in range(1, MAX_TOKENS):
        table = pooled_table([s[pos] for s in samples["plugin"]],
                             [s[pos] for s in samples["plain"]])
        assert len(table) >= 5, table


def test_every_request_went_through_the_rejection_sampler(samples):
    counts = samples["counts"]
    assert counts["num_drafts"] >= N  # each request verified a draft block after its prefill
    assert counts["num_draft_tokens"] >= N * (MAX_TOKENS - 1)
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]


def test_plugin_samples_the_targets_distribution(samples):
    p_values = position_p_values(samples["plugin"], samples["plain"])
    print(f"plugin vs plain p-values per position 2..{MAX_TOKENS}: {p_values}")
    assert min(p_values) > ALPHA, p_values


def test_a_wrong_acceptance_rule_fails_the_same_test(samples):
    p_values = position_p_values(samples["wrong"], samples["plain"])
    print(f"accept-every-draft vs plain p-values per position 2..{MAX_TOKENS}: {p_values}")
    assert min(p_values) < ALPHA, p_values
