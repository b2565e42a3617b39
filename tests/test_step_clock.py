"""The draft policy's step costs measured on served steps (dflash_plugin.step_clock), and the vLLM
adapter's side of it (vllm_ext.drafting, the propose hook P1) with fake vLLM objects: no engine."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dflash_plugin.draft_policy import (
    VLLM_CPU_COSTS,
    CostModel,
    DraftPolicy,
    PolicyMode,
    parse_cost_model,
    parse_cost_overrides,
)
from dflash_plugin.step_clock import MeasuredCosts, StepClock
from vllm_ext.drafting import Drafting, agree_across_ranks, step_clock_for

K = 7  # drafts per request at most: a decoding step's queries are 1 + K tokens at most
# The machine the synthetic steps come from, in milliseconds: a target step of N tokens costs
# 8 + 0.4 N, a draft pass for B requests 2 + 0.5 B. In plain-step units (8.4 ms):
TRUE_MS = dict(verify_fixed=8.0, verify_per_token=0.4, draft_fixed=2.0, draft_per_request=0.5)
PLAIN_MS = TRUE_MS["verify_fixed"] + TRUE_MS["verify_per_token"]
TRUE = CostModel(**{name: ms / PLAIN_MS for name, ms in TRUE_MS.items()})
PRESET = VLLM_CPU_COSTS  # verify 1 + 0.06 N, draft 0.24 + 0.08 B: far from TRUE


def target_ms(num_tokens):
    return TRUE_MS["verify_fixed"] + TRUE_MS["verify_per_token"] * num_tokens


def draft_ms(batch):
    return TRUE_MS["draft_fixed"] + TRUE_MS["draft_per_request"] * batch


def decoding_steps(count, seed=0, batches=(1, 2, 4, 8), noise=0.03):
    """(N, B, longest query, target ms, draft ms) of `count` decoding steps with per-request
    draft lengths 0..K and +-3% noise on every time."""
    rng = random.Random(seed)
    steps = []
    for _ in range(count):
        batch = rng.choice(batches)
        queries = [1 + rng.randint(0, K) for _ in range(batch)]
        n = sum(queries)
        steps.append((n, batch, max(queries), target_ms(n) * (1 + rng.uniform(-noise, noise)),
                      draft_ms(batch) * (1 + rng.uniform(-noise, noise))))
    return steps


def feed(clock, steps):
    for n, batch, longest, t_ms, d_ms in steps:
        clock.target_step(n, batch, longest, t_ms)
        clock.draft_pass(batch, longest, d_ms)


def assert_costs_close(costs, expected, rel):
    for name in ("verify_fixed", "verify_per_token", "draft_fixed", "draft_per_request"):
        assert getattr(costs, name) == pytest.approx(getattr(expected, name), rel=rel), name


def test_noisy_steps_give_back_the_machines_costs_in_plain_step_units():
    clock = StepClock(PRESET, 1 + K)
    feed(clock, decoding_steps(2048))
    measured = clock.fit()
    assert (measured.verify, measured.draft) == ("measured", "measured")
    assert_costs_close(measured.costs, TRUE, rel=0.03)
    assert measured.costs.verify_time(1) == pytest.approx(1.0)  # the unit: one plain step
    assert measured.plain_ms == pytest.approx(PLAIN_MS, rel=0.02)
    assert measured.steps == 2048
    # the preset's speed-up bars stay
    assert (measured.costs.min_speedup, measured.costs.min_speedup_batched) == \
        (PRESET.min_speedup, PRESET.min_speedup_batched)


def test_the_same_samples_always_give_the_same_model():
    fits = []
    for _ in range(2):
        clock = StepClock(PRESET, 1 + K)
        feed(clock, decoding_steps(600, seed=3))
        fits.append(clock.fit())
    assert fits[0] == fits[1]


def test_idle_gaps_and_prefill_steps_do_not_move_the_fit():
    steps = decoding_steps(2048, seed=1)
    clean = StepClock(PRESET, 1 + K, keep=10_000)
    feed(clean, steps)
    noisy = StepClock(PRESET, 1 + K, keep=10_000)
    rng = random.Random(7)
    for n, batch, longest, t_ms, d_ms in steps:
        if rng.random() < 0.05:  # the engine waited: the interval holds idle time
            t_ms += rng.uniform(200.0, 5000.0)
        if rng.random() < 0.1:  # a prefill (or chunked prefill) step, slow, and its draft pass
            noisy.target_step(n + 300, batch, 300, 900.0)
            noisy.draft_pass(batch, 300, 400.0)
        noisy.target_step(n, batch, longest, t_ms)
        noisy.draft_pass(batch, longest, d_ms)
    assert noisy.steps == clean.steps == len(steps)  # prefill steps are not counted
    assert_costs_close(noisy.fit().costs, clean.fit().costs, rel=0.02)
    assert_costs_close(noisy.fit().costs, TRUE, rel=0.03)


def test_one_draft_batch_scales_the_presets_draft_line():
    clock = StepClock(PRESET, 1 + K)
    feed(clock, decoding_steps(1024, batches=(1,), noise=0.0))
    measured = clock.fit()
    assert (measured.verify, measured.draft) == ("measured", "scaled")
    costs = measured.costs
    # the preset's shape, through the one measured point
    assert costs.draft_fixed / costs.draft_per_request == pytest.approx(
        PRESET.draft_fixed / PRESET.draft_per_request)
    assert costs.draft_time(1) == pytest.approx(draft_ms(1) / PLAIN_MS, rel=1e-6)
    assert costs.verify_per_token == pytest.approx(TRUE.verify_per_token, rel=1e-6)


def test_one_step_size_keeps_the_presets_verify_line_and_sets_the_unit():
    """Batch 1 with no drafts verified: every step is N = 1, so only the unit is measured."""
    clock = StepClock(PRESET, 1 + K)
    for _ in range(64):
        clock.target_step(1, 1, 1, target_ms(1))
        clock.draft_pass(1, 1, draft_ms(1))
        clock.draft_pass(1, 1, draft_ms(1))
    measured = clock.fit()
    assert (measured.verify, measured.draft) == ("preset", "scaled")
    assert (measured.costs.verify_fixed, measured.costs.verify_per_token) == \
        (PRESET.verify_fixed, PRESET.verify_per_token)
    assert measured.plain_ms == pytest.approx(target_ms(1) / PRESET.verify_time(1))
    assert measured.costs.draft_time(1) == pytest.approx(draft_ms(1) / measured.plain_ms)


def steady_load_steps(times_fall_with_n: bool):
    """A server under steady load: every step N = 25-32 (no drafts verified), each size 8
    times. With `times_fall_with_n`, noise makes the larger steps a little faster."""
    steps = []
    for n in range(25, 33):
        ms = target_ms(n) * ((1.0 - 0.004 * (n - 25)) if times_fall_with_n else 1.0)
        steps += [(n, n, 1, ms)] * 8
    return steps


@pytest.mark.parametrize("times_fall_with_n", [True, False])
def test_a_narrow_span_of_step_sizes_keeps_the_presets_verify_line(times_fall_with_n):
    """Fitted over N = 25-32, a line is noise: falling times used to give a flat model, under
    which verifying any number of drafts cost nothing. The preset's line stays, scaled through
    the measured points, so a 32-request step costs what was measured."""
    clock = StepClock(PRESET, 1 + K)
    for n, batch, longest, ms in steady_load_steps(times_fall_with_n):
        clock.target_step(n, batch, longest, ms)
    measured = clock.fit()
    assert measured.verify == "preset"
    costs = measured.costs
    assert (costs.verify_fixed, costs.verify_per_token) == \
        (PRESET.verify_fixed, PRESET.verify_per_token)
    assert costs.verify_time(32) * measured.plain_ms == pytest.approx(target_ms(32), rel=0.03)
    # what a flat model would have said: 150 drafts on 30 requests cost nothing
    assert costs.verify_time(30 + 150) > 1.5 * costs.verify_time(30)


def test_a_wide_span_whose_fit_is_clamped_keeps_the_presets_verify_line():
    """Times that fall with N over N = 1-32 (a machine that got quieter between the small
    steps and the large ones): relative_fit clamps the line flat, which is no line at all."""
    clock = StepClock(PRESET, 1 + K)
    for n in (1, 2, 4, 8, 16, 32):
        for _ in range(8):
            clock.target_step(n, n, 1, 40.0 - n)
    measured = clock.fit()
    assert measured.verify == "preset"
    assert measured.costs.verify_per_token == PRESET.verify_per_token
    assert measured.plain_ms is not None


def test_draft_passes_over_a_narrow_span_scale_the_presets_draft_line():
    """Draft passes for 1 and 2 requests only: their line's slope is not measured, so the
    preset's draft line is scaled through both points."""
    clock = StepClock(PRESET, 1 + K)
    feed(clock, decoding_steps(512, batches=(1, 2), noise=0.0))
    measured = clock.fit()
    assert (measured.verify, measured.draft) == ("measured", "scaled")
    costs = measured.costs
    assert costs.draft_fixed / costs.draft_per_request == pytest.approx(
        PRESET.draft_fixed / PRESET.draft_per_request)
    for batch in (1, 2):  # the truth lies on neither side of the scaled line by much
        assert costs.draft_time(batch) == pytest.approx(draft_ms(batch) / PLAIN_MS, rel=0.25)


def test_a_preset_that_prices_drafts_at_zero_gets_a_measured_fixed_draft_cost():
    """No shape to scale: the draft passes' time becomes a fixed cost, the same at every B."""
    preset = replace(PRESET, draft_fixed=0.0, draft_per_request=0.0)
    clock = StepClock(preset, 1 + K)
    feed(clock, decoding_steps(512, batches=(1, 2), noise=0.0))
    measured = clock.fit()
    assert measured.draft == "scaled"
    costs = measured.costs
    assert costs.draft_per_request == 0.0
    assert draft_ms(1) / PLAIN_MS < costs.draft_fixed < draft_ms(2) / PLAIN_MS


def test_no_samples_or_too_few_keep_the_preset():
    measured = StepClock(PRESET, 1 + K).fit()
    assert measured == MeasuredCosts(PRESET, 0, "preset", "preset", None)
    clock = StepClock(PRESET, 1 + K, min_samples=5)
    for n in (1, 2, 3, 4):  # four step sizes, four samples each: too few for a point
        for _ in range(4):
            clock.target_step(n, 1, n, target_ms(n))
            clock.draft_pass(n % 2 + 1, n, draft_ms(1))
    assert clock.fit().costs == PRESET


def test_fields_the_user_set_survive_a_refit(monkeypatch):
    text = "verify_per_token=0.5,draft_fixed=0.3,min_speedup=1.3"
    preset = parse_cost_model(text, PRESET)
    clock = StepClock(preset, 1 + K, pinned=parse_cost_overrides(text))
    feed(clock, decoding_steps(2048))
    costs = clock.fit().costs
    assert (costs.verify_per_token, costs.draft_fixed, costs.min_speedup) == (0.5, 0.3, 1.3)
    # the others are measured
    assert costs.verify_fixed == pytest.approx(TRUE.verify_fixed, rel=0.03)
    assert costs.draft_per_request == pytest.approx(TRUE.draft_per_request, rel=0.05)
    # the same through the adapter, from DFLASH_COST_MODEL
    monkeypatch.setenv("DFLASH_COST_MODEL", text)
    adapter_clock = step_clock_for(DraftPolicy(PolicyMode.ADAPTIVE, preset, K), K)
    assert adapter_clock.pinned == {"verify_per_token", "draft_fixed", "min_speedup"}
    assert adapter_clock.preset == preset and adapter_clock.max_decode_query == 1 + K
    assert step_clock_for(DraftPolicy(PolicyMode.FULL, preset, K), K) is None  # reads no costs


def test_refits_are_due_every_so_many_decoding_steps_whatever_their_times():
    clock = StepClock(PRESET, 1 + K, refit_every=4)
    due = []
    for i in range(12):
        clock.target_step(50, 2, 40, 10.0)  # prefill: not counted
        # times of every kind, unusable ones included: only the step's shape counts
        due.append(clock.target_step(3, 2, 2, [10.0, float("nan"), -1.0, 1e6][i % 4]))
    assert due == [False, False, False, True] * 3
    assert clock.steps == 12
    never = StepClock(PRESET, 1 + K, refit_every=0)
    assert not any(never.target_step(2, 1, 2, 10.0) for _ in range(1000))
    with pytest.raises(ValueError, match="not CostModel fields"):
        StepClock(PRESET, 1 + K, pinned=["speed"])


def test_old_samples_age_out():
    clock = StepClock(PRESET, 1 + K, window=512, keep=10_000)
    for n, batch, longest, t_ms, d_ms in decoding_steps(1024, seed=2):
        clock.target_step(n, batch, longest, 3 * t_ms)  # a busier machine, earlier
        clock.draft_pass(batch, longest, 3 * d_ms)
    feed(clock, decoding_steps(1024, seed=4))
    assert_costs_close(clock.fit().costs, TRUE, rel=0.03)
    assert clock.fit().plain_ms == pytest.approx(PLAIN_MS, rel=0.02)


class FakeGroup:
    """vLLM's tensor-parallel GroupCoordinator as seen from one rank."""

    def __init__(self, world_size, rank0_sends=None):
        self.world_size = world_size
        self.rank0_sends = rank0_sends
        self.calls = []

    def broadcast_object(self, obj=None, src=0):
        self.calls.append((obj, src))
        return self.rank0_sends if self.rank0_sends is not None else obj


def test_tensor_parallel_ranks_take_rank_0s_model():
    mine = MeasuredCosts(PRESET, 256, "measured", "measured", 8.0)
    rank0 = MeasuredCosts(TRUE, 256, "measured", "measured", 8.4)
    group = FakeGroup(4, rank0_sends=rank0)
    assert agree_across_ranks(mine, group) == rank0
    assert group.calls == [(mine, 0)]
    alone = FakeGroup(1, rank0_sends=rank0)
    assert agree_across_ranks(mine, alone) is mine and alone.calls == []
    assert agree_across_ranks(mine) is mine  # no vLLM group set up in this process


class FakeTime:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def advance(self, ms):
        self.t += ms / 1e3


def query_lengths(num_tokens, batch, longest):
    """Per-request query lengths of a step: `batch` of them, the longest `longest`, in all
    `num_tokens`."""
    queries = [longest] + [1] * (batch - 1)
    for i in range(1, batch):
        extra = min(longest - 1, num_tokens - sum(queries))
        queries[i] += extra
    assert sum(queries) == num_tokens and max(queries) == longest
    return queries


def fake_cad(query_lens):
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return SimpleNamespace(batch_size=lambda: len(query_lens), query_start_loc_cpu=starts,
                           num_actual_tokens=int(starts[-1]))


def test_drafting_times_steps_and_draft_passes_and_refits_the_policy(caplog):
    policy = DraftPolicy(PolicyMode.ADAPTIVE, PRESET, K)
    policy._worth_drafting[(1, False)] = True  # an answer under the preset
    clock = StepClock(PRESET, 1 + K, refit_every=200)
    drafting = Drafting(policy, clock=clock)
    drafting.now = time = FakeTime()
    with drafting.timing_step(fake_cad([300])):  # the prefill: no previous call, not timed
        time.advance(1000.0)
    reference = StepClock(PRESET, 1 + K)  # the same samples, handed in directly
    with caplog.at_level(logging.INFO, logger="vllm.vllm_ext.drafting"):
        for n, batch, longest, t_ms, d_ms in decoding_steps(200, seed=5):
            reference.target_step(n, batch, longest, t_ms)
            time.advance(t_ms)  # the target step, between two propose calls
            queries = query_lengths(n, batch, longest)
            with drafting.timing_step(fake_cad(queries)):
                time.advance(0.05)  # the hook's own work: in neither sample
                with drafting.timing_draft_pass():
                    time.advance(d_ms)
                time.advance(0.05)
            if clock.steps < 200:
                assert policy.costs == PRESET
                reference.draft_pass(batch, longest, d_ms)
    assert clock.steps == 200 and clock.draft_passes == 200  # the refit saw 199 of them
    assert policy._worth_drafting == {}  # answers under the preset are gone
    assert_costs_close(policy.costs, reference.fit().costs, rel=1e-6)
    assert_costs_close(policy.costs, TRUE, rel=0.1)
    assert "step costs measured over 200 decoding steps: verify 0.9" in caplog.text
    assert caplog.text.count("step costs measured") == 1


def test_drafting_refit_takes_rank_0s_costs(monkeypatch):
    import vllm_ext.drafting as drafting_module

    rank0 = MeasuredCosts(replace(PRESET, verify_per_token=0.2), 2, "measured", "measured", 5.0)
    group = FakeGroup(2, rank0_sends=rank0)
    monkeypatch.setattr(drafting_module, "_tensor_parallel_group", lambda: group)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, PRESET, K)
    drafting = Drafting(policy, clock=StepClock(PRESET, 1 + K, refit_every=2))
    drafting.now = time = FakeTime()
    for _ in range(3):
        time.advance(10.0)
        with drafting.timing_step(fake_cad([1])):
            pass
    assert len(group.calls) == 1 and policy.costs.verify_per_token == 0.2


def test_the_propose_hook_feeds_the_clock():
    """P1 around a fake proposer: each call's entry closes the target step, and the time in
    vLLM's original propose is the draft pass."""
    from vllm_ext.patches import _load_aware_propose

    time = FakeTime()
    clock = StepClock(PRESET, 1 + K, min_samples=1)
    drafting = Drafting(DraftPolicy(PolicyMode.FULL, PRESET, K), clock=clock)
    drafting.now = time
    proposer = SimpleNamespace(
        vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False),
                                    speculative_config=SimpleNamespace()),
        model=SimpleNamespace(dflash_drafting=drafting), _last_draft_probs=None,
        use_local_argmax_reduction=False)

    def original(proposer, num_speculative_tokens, target_token_ids, *rest):
        time.advance(draft_ms(2))
        return torch.arange(2 * num_speculative_tokens).view(2, num_speculative_tokens)

    propose = _load_aware_propose(original)
    for query_lens in ([1, 1], [3, 5], [8, 2]):
        cad = fake_cad(query_lens)
        tokens = torch.arange(cad.num_actual_tokens)
        time.advance(target_ms(cad.num_actual_tokens))
        drafts = propose(proposer, K, tokens, tokens, torch.zeros(len(tokens), 4),
                         torch.tensor([1, 2]), None, cad, SimpleNamespace())
        assert drafts == [list(range(K)), list(range(K, 2 * K))]
    assert clock.steps == 2  # the first call had no step before it
    assert {n: [ms for _, ms in group] for n, group in clock._verify.items()} == {
        8: [pytest.approx(target_ms(8))], 10: [pytest.approx(target_ms(10))]}
    assert [ms for _, ms in clock._draft[2]] == [pytest.approx(draft_ms(2))] * 3


def test_refits_that_change_nothing_log_at_debug_only(caplog):
    policy = DraftPolicy(PolicyMode.ADAPTIVE, PRESET, K)
    # 128 steps a refit: enough for every step size of the first one to be a point
    drafting = Drafting(policy, clock=StepClock(PRESET, 1 + K, refit_every=128))
    drafting.now = time = FakeTime()
    with caplog.at_level(logging.DEBUG, logger="vllm.vllm_ext.drafting"):
        for n, batch, longest, t_ms, d_ms in decoding_steps(3 * 128 + 1, seed=6, noise=0.0):
            time.advance(t_ms)
            with drafting.timing_step(fake_cad(query_lengths(n, batch, longest))):
                with drafting.timing_draft_pass():
                    time.advance(d_ms)
    lines = [r for r in caplog.records if "step costs measured" in r.getMessage()]
    assert [r.levelname for r in lines] == ["INFO", "DEBUG", "DEBUG"]
    assert_costs_close(policy.costs, TRUE, rel=1e-6)
