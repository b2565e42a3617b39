"""Load-aware draft lengths on the reference path (AdaptiveSpecDecoder): the emitted tokens are
the target's own whatever the policy verifies or skips, greedy on the real SmolLM2 target in
float32 and sampled on the tiny target (exact joint distribution); a skipped draft pass leaves
its context for the next one, so the drafter's cache always covers every committed position."""

import pytest
import torch
from core_helpers import EOS, PLAIN_MAX_NEW, PROMPTS, chi_square_pvalue, exact_joint, make_drafter

from dflash_plugin.adaptive_decode import AdaptiveSpecDecoder
from dflash_plugin.sampling import SamplingParams

MAX_NEW = PLAIN_MAX_NEW  # the length of the shared plain references (conftest.plain_results)


def skip_every_other_draft_pass(decoder):
    """Every other round a plain step (the draft pass skipped), so the skip path and its
    pending context run between draft passes whatever the cost model decides."""
    should_draft, rounds = decoder.policy.should_draft, [0]

    def alternating(batch):
        rounds[0] += 1
        return rounds[0] % 2 == 1 and should_draft(batch)
    decoder.policy.should_draft = alternating


def watch_draft_cache(decoder):
    """Record, per draft pass, (first block position, drafter cache length after the pass)."""
    calls = []
    original = decoder.draft_logits

    def draft_logits(bonus, start, context, cache, block, num_drafts=None):
        logits = original(bonus, start, context, cache, block, num_drafts)
        calls.append((start, len(cache)))
        return logits
    decoder.draft_logits = draft_logits
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("skipping", ["policy", "alternating"])
def test_adaptive_greedy_matches_plain(target_f32, shipped_drafter_f32, chat_prompts, plain_results,
                                       skipping):
    decoder = AdaptiveSpecDecoder(target_f32, shipped_drafter_f32)
    if skipping == "alternating":
        skip_every_other_draft_pass(decoder)
    calls = watch_draft_cache(decoder)
    lengths = []  # drafts verified per draft pass
    choose = decoder.policy.choose

    def recording_choose(*args):
        chosen = choose(*args)
        lengths.extend(chosen)
        return chosen
    decoder.policy.choose = recording_choose
    draft_passes, plain_rounds, accepted = 0, 0, 0
    for i, ids in enumerate(chat_prompts):
        plain = plain_results(i)
        calls.clear()
        spec = decoder.generate(ids, MAX_NEW, stop_token_ids={EOS})
        assert spec.token_ids == plain.token_ids
        assert spec.finish_reason == plain.finish_reason
        # After every draft pass the drafter's cache holds exactly the positions before the
        # block: context skipped by plain rounds was caught up, none was written twice.
        assert all(start == cached for start, cached in calls)
        draft_passes += len(calls)
        plain_rounds += spec.stats.num_steps - len(calls)
        accepted += spec.stats.accepted_tokens
    assert draft_passes > len(PROMPTS) and accepted > 0
    assert len(set(lengths)) > 1  # the verify length followed the drafts, not one fixed value
    if skipping == "alternating":
        assert plain_rounds > len(PROMPTS)  # the skip path ran, between draft passes
    assert decoder.policy.calibration.num_drafts_seen > 0  # verification fed the policy


def test_adaptive_sampling_is_exact(tiny_target):
    """T > 0 with top-k/top-p, alternating plain and drafted rounds: the joint of the first 3
    tokens over many seeds matches the exact enumeration."""
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=4)
    prompt = [0, 5, 9, 3, 7]
    drafter = make_drafter(tiny_target, block_size=4, mask_token_id=15)
    decoder = AdaptiveSpecDecoder(tiny_target, drafter)
    skip_every_other_draft_pass(decoder)
    samples = []
    for seed in range(800):
        result = decoder.generate(torch.tensor([prompt]), 3, sampling, seed=seed)
        assert len(result.token_ids) == 3
        samples.append(tuple(result.token_ids))
    joint = exact_joint(tiny_target, prompt, 3, sampling)
    assert chi_square_pvalue(samples, joint) > 1e-3
    untruncated = exact_joint(tiny_target, prompt, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(samples, untruncated) < 1e-6
