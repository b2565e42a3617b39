"""Greedy speculative vs plain decoding in bfloat16 on the real target. Verifying a block and
decoding one token at a time round differently in bf16, so outputs may part; where they do,
the target's top two logits must be a near-tie (the divergence is rounding, not a bug)."""

import math

import pytest
import torch
from core_helpers import EOS, PROMPTS, make_drafter

from dflash_plugin.diagnostics import first_divergence, logit_gap_at
from dflash_plugin.generate import SpecDecoder, generate_plain

pytestmark = pytest.mark.slow

MAX_NEW = 48
MIN_MATCHES = 6
# SmolLM2's bf16 logits are ~15-35 and carry 8 significant bits, so neighbouring values are
# 0.125 (16-32) or 0.25 (32-64) apart: no gap below one step can even be seen. A near-tie is a
# gap of at most 2 such steps (measured divergences: 0.25 at 18.75 and 0.25 at 32.25).
MAX_STEPS = 2


def bf16_step(x: float) -> float:
    """Distance between neighbouring bf16 values around x."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def test_diagnostics_helpers(target_f32, chat_prompts):
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [4]) == 0
    ids = chat_prompts[0]
    plain = generate_plain(target_f32, ids, 3)
    gap = logit_gap_at(target_f32, ids, plain.token_ids[:2])
    assert gap.top_ids[0] == plain.token_ids[2]  # greedy picks the top logit
    assert gap.gap >= 0 and gap.top_logits[0] >= gap.top_logits[1]
    assert gap.relative_gap == pytest.approx(gap.gap / abs(gap.top_logits[0]))


def test_bf16_step():
    assert bf16_step(18.75) == 0.125 and bf16_step(32.25) == 0.25 and bf16_step(-3.0) == 2 ** -6
    assert torch.tensor(20.0 + bf16_step(20.0) / 4, dtype=torch.bfloat16).item() == 20.0


def test_bf16_spec_matches_plain_or_diverges_at_near_ties(smollm_bf16, target_f32, chat_prompts):
    target, _ = smollm_bf16
    decoder = SpecDecoder(target, make_drafter(target, block_size=16))
    matches, report = 0, []
    for i, ids in enumerate(chat_prompts):
        plain = generate_plain(target, ids, MAX_NEW, stop_token_ids={EOS}).token_ids
        spec = decoder.generate(ids, MAX_NEW, stop_token_ids={EOS}).token_ids
        d = first_divergence(plain, spec)
        if d is None:
            matches += 1
            report.append(f"prompt {i}: identical ({len(plain)} tokens)")
            continue
        assert d < min(len(plain), len(spec)), "one output is a prefix of the other"
        gap = logit_gap_at(target, ids, plain[:d])
        f32 = logit_gap_at(target_f32, ids, plain[:d])  # for the report: the float32 view
        steps = gap.gap / bf16_step(gap.top_logits[0])
        report.append(f"prompt {i}: diverge at {d}/{len(plain)}: plain {plain[d]} spec {spec[d]}, "
                      f"bf16 top-2 {gap.top_ids} logits {gap.top_logits[0]:.4f} "
                      f"{gap.top_logits[1]:.4f}, gap {gap.gap:.4f} = {steps:g} bf16 steps "
                      f"({100 * gap.relative_gap:.2f}%); float32 top-2 {f32.top_ids} "
                      f"gap {f32.gap:.4f}")
        assert {plain[d], spec[d]} == set(gap.top_ids), report[-1]
        assert steps <= MAX_STEPS, report[-1]
    print(f"\nbf16 greedy spec == plain on {matches}/{len(PROMPTS)} prompts\n" + "\n".join(report))
    assert matches >= MIN_MATCHES
