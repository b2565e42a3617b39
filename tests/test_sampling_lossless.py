"""Speculative sampling (T > 0, top-k, top-p) emits tokens distributed exactly as the target's
own sampling: the empirical joint of the first generated tokens over many seeds is compared
with the exact joint, enumerated from the target's processed distributions."""

import time

import pytest
import torch
from core_helpers import (
    ProposingDecoder,
    chi_square_pvalue,
    exact_joint,
    make_drafter,
    next_token_probs,
)

from dflash_plugin.generate import SpecDecoder
from dflash_plugin.sampling import SamplingParams, choose_tokens, target_probs

# ---- target_probs semantics on synthetic logits ---------------------------------------------

LOGITS = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))  # sorted: 1 (0.5), 3 (0.3), 2, 0


def test_temperature_scales_logits():
    got = target_probs(LOGITS, SamplingParams(temperature=2.0))
    assert torch.allclose(got, torch.softmax(LOGITS / 2.0, dim=-1))
    assert torch.allclose(target_probs(LOGITS, SamplingParams(temperature=1.0)),
                          torch.tensor([0.05, 0.5, 0.15, 0.3]), atol=1e-6)


def test_top_k_keeps_k_best_renormalised():
    got = target_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(got, torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]), atol=1e-6)
    # top_k >= vocab changes nothing
    full = target_probs(LOGITS, SamplingParams(temperature=1.0, top_k=4))
    assert torch.allclose(full, torch.tensor([0.05, 0.5, 0.15, 0.3]), atol=1e-6)


@pytest.mark.parametrize("top_p, kept", [(0.3, [1]), (0.5, [1]), (0.7, [1, 3]),
                                         (0.85, [1, 3, 2]), (0.99, [1, 3, 2, 0])])
def test_top_p_keeps_smallest_prefix_reaching_p(top_p, kept):
    got = target_probs(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    base = torch.tensor([0.05, 0.5, 0.15, 0.3])
    want = torch.zeros(4)
    want[kept] = base[kept] / base[kept].sum()
    assert torch.allclose(got, want, atol=1e-6)


def test_top_k_applies_before_top_p():
    # after top_k=3 the kept probabilities are 0.5/0.95, 0.3/0.95, 0.15/0.95; top_p=0.8 needs
    # the first two (0.526 < 0.8 <= 0.842), so token 2 goes
    got = target_probs(LOGITS, SamplingParams(temperature=1.0, top_k=3, top_p=0.8))
    assert torch.allclose(got, torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]), atol=1e-6)


def test_rows_are_independent():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    got = target_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]


def test_choose_tokens_greedy_and_sampled():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    assert choose_tokens(logits, SamplingParams(), None).tolist() == [1, 2]
    gen = torch.Generator().manual_seed(0)
    draws = choose_tokens(LOGITS.expand(4000, 4), SamplingParams(1.0, top_k=2), gen)
    assert set(draws.tolist()) == {1, 3}
    assert abs((draws == 1).float().mean().item() - 0.625) < 0.03


# ---- speculative sampling vs exact enumeration ----------------------------------------------

NUM_TOKENS = 3  # with block 2 this covers "all drafts accepted, then the bonus"


def oracle(target, prompt, sampling):
    """Proposes the target's most likely next token (memoised per prefix)."""
    memo = {}

    def propose(seq):
        key = tuple(seq)
        if key not in memo:
            memo[key] = int(next_token_probs(target, prompt, [list(seq)], sampling)[0].argmax())
        return memo[key]
    return propose


def run_many(decoder, ids, sampling, runs):
    samples, accepted = [], 0
    for seed in range(runs):
        result = decoder.generate(ids, NUM_TOKENS, sampling, seed=seed)
        assert len(result.token_ids) == NUM_TOKENS and result.finish_reason == "length"
        samples.append(tuple(result.token_ids))
        accepted += result.stats.accepted_tokens
    return samples, accepted


TINY_SAMPLING = SamplingParams(temperature=1.0, top_p=0.9, top_k=4)
TINY_PROMPT = [0, 5, 9, 3, 7]


@pytest.mark.parametrize("proposer, block_size", [("oracle", 2), ("oracle", 4), ("random", 4)])
def test_tiny_target_speculative_sampling_is_exact(tiny_target, proposer, block_size):
    drafter = make_drafter(tiny_target, block_size=block_size, mask_token_id=15)
    ids = torch.tensor([TINY_PROMPT])
    if proposer == "oracle":
        decoder = ProposingDecoder(tiny_target, drafter, block_size, len(TINY_PROMPT),
                                   oracle(tiny_target, TINY_PROMPT, TINY_SAMPLING))
    else:
        decoder = SpecDecoder(tiny_target, drafter, block_size=block_size)
    runs = 800
    samples, accepted = run_many(decoder, ids, TINY_SAMPLING, runs)
    joint = exact_joint(tiny_target, TINY_PROMPT, NUM_TOKENS, TINY_SAMPLING)
    pvalue = chi_square_pvalue(samples, joint)
    print(f"\n{proposer} B={block_size}: {len(joint)} cells, accepted drafts/run "
          f"{accepted / runs:.2f}, chi-square p = {pvalue:.3g}")
    assert pvalue > 1e-3
    if proposer == "oracle":
        assert accepted / runs > 0.5  # the accept path ran often
    # power: the same samples are clearly not from the untruncated distribution
    untruncated = exact_joint(tiny_target, TINY_PROMPT, NUM_TOKENS, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(samples, untruncated) < 1e-6


@pytest.mark.slow
def test_real_target_speculative_sampling_is_exact(target_f32, tokenizer):
    """SmolLM2 in float32: the first 3 sampled tokens after a short plain-text prompt."""
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=5)
    prompt = tokenizer("The three primary colors are")["input_ids"]
    drafter = make_drafter(target_f32, block_size=2)
    decoder = ProposingDecoder(target_f32, drafter, 2, len(prompt),
                               oracle(target_f32, prompt, sampling))
    began = time.perf_counter()
    runs = 160  # ~0.3 s of CPU each; the tiny-target tests above carry the statistical power
    samples, accepted = run_many(decoder, torch.tensor([prompt]), sampling, runs)
    joint = exact_joint(target_f32, prompt, NUM_TOKENS, sampling)
    pvalue = chi_square_pvalue(samples, joint)
    print(f"\nSmolLM2 oracle B=2: {runs} runs in {time.perf_counter() - began:.1f}s, "
          f"{len(joint)} cells, accepted drafts/run {accepted / runs:.2f}, p = {pvalue:.3g}")
    assert pvalue > 1e-3
    assert accepted / runs > 0.3
