"""Load-aware draft lengths on the reference path (AdaptiveSpecDecoder): the emitted tokens are
the target's own whatever the policy verifies or skips, greedy on the real SmolLM2 target in
float32 and sampled on the tiny target (exact joint distribution); a skipped draft pass leaves
its context for the next one, so the drafter's cache always covers every committed position."""

import pytest
import torch
from core_helpers import EOS, PLAIN_MAX_NEW, PROMPTS, chi_square_pvalue, exact_joint, make_drafter

from dflash_plugin.adaptive_decode import AdaptiveSpecDecoder
from dflash_plugin.generate import generate_plain
from dflash_plugin.rate_guard import RateGuard, WindowGuard
from dflash_plugin.sampling import SamplingParams

MAX_NEW = PLAIN_MAX_NEW  # the length of the shared plain references (conftest.plain_results)


class AlternatingGuard(RateGuard):
    """Asks for a plain step every other round, so the skip path and its pending context run
    between draft passes (a real guard does this only while it measures the plain arm)."""

    def __init__(self):
        super().__init__()
        self.asks = 0

    def needs_plain_sample(self, batch: int) -> bool:
        self.asks += 1
        return self.asks % 2 == 0

    def drafting_loses(self, batch: int) -> bool:
        return False  # timings never veto here: the test decides which rounds are plain


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
@pytest.mark.parametrize("guard", ["none", "alternating", "window"])
def test_adaptive_greedy_matches_plain(target_f32, shipped_drafter_f32, chat_prompts, plain_results,
                                       guard):
    rate_guard = AlternatingGuard() if guard == "alternating" else None
    # Windows of 4 rounds, the first ones alternating on and off while both arms are measured
    window_guard = WindowGuard(window=4) if guard == "window" else None
    decoder = AdaptiveSpecDecoder(target_f32, shipped_drafter_f32, rate_guard=rate_guard,
                                  window_guard=window_guard)
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
    if guard != "none":
        assert plain_rounds > len(PROMPTS)  # the skip path ran, between draft passes
    if guard == "window":
        assert window_guard.arm(1, True).windows and window_guard.arm(1, False).windows
    assert decoder.policy.calibration.num_drafts_seen > 0  # verification fed the policy


def test_adaptive_sampling_is_exact(tiny_target):
    """T > 0 with top-k/top-p, alternating plain and drafted rounds: the joint of the first 3
    tokens over many seeds matches the exact enumeration."""
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=4)
    prompt = [0, 5, 9, 3, 7]
    drafter = make_drafter(tiny_target, block_size=4, mask_token_id=15)
    decoder = AdaptiveSpecDecoder(tiny_target, drafter, rate_guard=AlternatingGuard())
    samples = []
    for seed in range(800):
        result = decoder.generate(torch.tensor([prompt]), 3, sampling, seed=seed)
        assert len(result.token_ids) == 3
        samples.append(tuple(result.token_ids))
    joint = exact_joint(tiny_target, prompt, 3, sampling)
    assert chi_square_pvalue(samples, joint) > 1e-3
    untruncated = exact_joint(tiny_target, prompt, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(samples, untruncated) < 1e-6


def test_cost_fit_is_fed_every_round_and_stays_lossless(tiny_target):
    """With fit_costs, each round hands the fit its target tokens (the bonus plus the drafts it
    verified) and whether the draft pass ran; greedy output is still the target's own."""
    drafter = make_drafter(tiny_target, block_size=4, mask_token_id=15)
    decoder = AdaptiveSpecDecoder(tiny_target, drafter, rate_guard=None, fit_costs=True)
    fit = decoder.policy.cost_fit
    rounds = []
    record = fit.record

    def recording(batch, target_tokens, drafted, seconds):
        rounds.append((batch, target_tokens, drafted))
        return record(batch, target_tokens, drafted, seconds)
    fit.record = recording
    prompt = torch.tensor([[0, 5, 9, 3, 7]])
    result = decoder.generate(prompt, 24)
    assert result.token_ids == generate_plain(tiny_target, prompt, 24).token_ids
    assert len(rounds) == result.stats.num_steps and fit.steps_seen == len(rounds)
    assert sum(tokens - 1 for _, tokens, _ in rounds) == result.stats.drafted_tokens
    assert all(batch == 1 and (drafted or tokens == 1) for batch, tokens, drafted in rounds)
    assert any(drafted for _, _, drafted in rounds)  # a new policy tries its drafter
    assert fit.seconds_per_plain_step is not None  # past its warm-up: the fit is in use
