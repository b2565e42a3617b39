"""How the vLLM adapter times decoding steps for the rate guard (engine-free, fake clock)."""

import pytest
import torch

from dflash_plugin.draft_policy import CPU_COSTS, DraftPolicy, PolicyMode
from dflash_plugin.rate_guard import RateGuard, WindowGuard
from vllm_ext.drafting import Drafting

BLOCK = 4


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_drafting():
    guard = RateGuard(min_samples=1)
    drafting = Drafting(DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, rate_guard=guard))
    drafting.clock = FakeClock()
    return drafting, guard


def step(drafting, query_lens, rejected=None):
    """The propose call of one step: what the target just processed, per request."""
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    ids = torch.arange(int(starts[-1]))
    drafting.learn(ids, starts, None if rejected is None else torch.tensor(rejected))


def test_plain_and_drafted_steps_are_timed_as_emitted_tokens_per_second():
    drafting, guard = make_drafting()
    step(drafting, [1, 1])
    drafting.skipped(2)  # plain step for two requests
    drafting.clock.now = 0.1
    step(drafting, [1, 1], rejected=[0, 0])
    assert guard.arm(2, False).rate == pytest.approx(20.0)  # 2 tokens in 0.1 s
    drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    drafting.clock.now = 0.3
    # The policy had no confidences: both requests verified all 4 drafts; 1 and 3 were rejected.
    step(drafting, [5, 5], rejected=[1, 3])
    assert guard.arm(2, True).rate == pytest.approx((2 + 8 - 4) / 0.2)


def test_steps_where_requests_join_or_leave_are_not_timed():
    drafting, guard = make_drafting()
    step(drafting, [1, 1])
    drafting.skipped(2)
    drafting.clock.now = 0.1
    step(drafting, [1, 1, 7])  # a new request's prefill joined
    drafting.skipped(3)
    drafting.clock.now = 0.2
    step(drafting, [1, 1])  # a request left
    assert guard.arm(2, False).samples == 0 and guard.arm(3, False).samples == 0
    drafting.skipped(2)
    drafting.clock.now = 0.25
    step(drafting, [1, 1])
    assert guard.arm(2, False).samples == 1


def test_window_guard_pools_the_timed_steps_of_its_windows():
    guard = WindowGuard(window=2)
    drafting = Drafting(DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, window_guard=guard))
    drafting.clock = FakeClock()
    step(drafting, [1])
    assert drafting.policy.should_draft(1)  # the first window is "on"
    drafting.select(torch.tensor([[5, 6, 7, 8]]), torch.tensor([1]))  # all 4 drafts verified
    drafting.clock.now = 0.2
    step(drafting, [5], rejected=[2])  # 3 tokens in 0.2 s
    assert drafting.policy.should_draft(1)
    drafting.select(torch.tensor([[5, 6, 7, 8]]), torch.tensor([1]))
    drafting.clock.now = 0.3
    step(drafting, [5], rejected=[4])  # 1 token in 0.1 s: the window closes
    assert guard.arm(1, True).windows == 1
    assert guard.arm(1, True).rate == pytest.approx(4 / 0.3)
    assert not drafting.policy.should_draft(1)  # the next window measures "off"
    drafting.skipped(1)
    drafting.clock.now = 0.35
    step(drafting, [1], rejected=[0])
    assert guard.arm(1, False).windows == 0  # half a window so far


def test_rate_guard_switch_from_the_environment(monkeypatch):
    from vllm_ext.drafting import RATE_GUARD_ENV, rate_guard_from_env, window_guard_from_env

    monkeypatch.delenv(RATE_GUARD_ENV, raising=False)
    assert rate_guard_from_env() is None  # off by default
    monkeypatch.setenv(RATE_GUARD_ENV, "ON")
    assert isinstance(rate_guard_from_env(), RateGuard)
    monkeypatch.setenv(RATE_GUARD_ENV, "off")
    assert rate_guard_from_env() is None
    monkeypatch.setenv(RATE_GUARD_ENV, "window")
    assert rate_guard_from_env() is None
    assert isinstance(window_guard_from_env(), WindowGuard)
    monkeypatch.setenv(RATE_GUARD_ENV, "on")
    assert window_guard_from_env() is None
    monkeypatch.setenv(RATE_GUARD_ENV, "sometimes")
    with pytest.raises(ValueError, match="DFLASH_RATE_GUARD='sometimes': expected off, on or window"):
        rate_guard_from_env()


def test_draft_vocabulary_switch_from_the_environment(monkeypatch):
    from vllm_ext.drafting import DRAFT_VOCAB_ENV, draft_vocab_from_env

    monkeypatch.delenv(DRAFT_VOCAB_ENV, raising=False)
    assert draft_vocab_from_env()  # the checkpoint's training vocabulary when it has one
    monkeypatch.setenv(DRAFT_VOCAB_ENV, "full")
    assert not draft_vocab_from_env()
    monkeypatch.setenv(DRAFT_VOCAB_ENV, "tiny")
    with pytest.raises(ValueError, match="DFLASH_DRAFT_VOCAB='tiny'"):
        draft_vocab_from_env()


def test_step_counts_are_logged_every_n_steps(caplog):
    drafting, guard = make_drafting()
    drafting.stats_every = 3
    step(drafting, [1, 1])
    drafting.skipped(2)
    drafting.clock.now = 0.1
    step(drafting, [1, 1], rejected=[0, 0])
    drafting.confidence = torch.full((2 * BLOCK,), 0.99)  # a confident drafter
    selected = drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    assert selected == [[5, 6, 7, 8]] * 2
    counts = drafting.counts
    assert (counts.steps, counts.draft_passes, counts.empty_passes) == (2, 1, 0)
    assert counts.drafts_handed_out == 8
    drafting.clock.now = 0.3
    with caplog.at_level("INFO", logger="vllm.vllm_ext.drafting"):
        # third step (verifying what was handed out): logged, then a new window
        drafting.learn(torch.tensor([1, 5, 6, 7, 8, 2, 5, 6, 7, 8]), torch.tensor([0, 5, 10]),
                       torch.tensor([1, 3]))
    assert "3 steps: 1 draft passes (0 handed out nothing), 8 drafts verified, 4 accepted" \
        in caplog.text
    assert "batch<4': 1.5" in caplog.text  # drafted 30 tok/s vs plain 20 tok/s
    assert drafting.counts.steps == 0


def test_full_mode_counts_accepted_drafts_without_reading_confidences():
    drafting = Drafting(DraftPolicy(PolicyMode.FULL, CPU_COSTS, BLOCK))
    drafting.clock = FakeClock()
    step(drafting, [1, 1])
    selected = drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    assert selected == [[5, 6, 7, 8]] * 2
    drafting.learn(torch.tensor([1, 5, 6, 7, 8, 2, 5, 6, 7, 8]), torch.tensor([0, 5, 10]),
                   torch.tensor([4, 1]))
    assert drafting.counts.drafts_accepted == 0 + 3  # nothing of the first, 3 of the second
    assert drafting.policy.calibration.num_drafts_seen == 0  # no confidences: nothing learnt


def test_stats_interval_from_the_environment(monkeypatch):
    from vllm_ext.drafting import STATS_EVERY_ENV, stats_every_from_env

    monkeypatch.delenv(STATS_EVERY_ENV, raising=False)
    assert stats_every_from_env() == 2000
    monkeypatch.setenv(STATS_EVERY_ENV, "0")
    assert stats_every_from_env() == 0
    monkeypatch.setenv(STATS_EVERY_ENV, "-5")
    with pytest.raises(ValueError, match="DFLASH_STATS_EVERY='-5'"):
        stats_every_from_env()


def test_the_cost_fit_gets_each_clean_step_with_the_tokens_the_target_processed():
    from dflash_plugin.step_costs import StepCostFit

    class RecordingFit(StepCostFit):
        def __init__(self):
            super().__init__(CPU_COSTS)
            self.steps = []

        def record(self, batch, target_tokens, drafted, seconds):
            self.steps.append((batch, target_tokens, drafted, round(seconds, 6)))
            return super().record(batch, target_tokens, drafted, seconds)

    fit = RecordingFit()
    drafting = Drafting(DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, cost_fit=fit))
    drafting.clock = FakeClock()
    step(drafting, [1, 1])
    drafting.skipped(2)
    drafting.clock.now = 0.1
    step(drafting, [1, 1], rejected=[0, 0])
    drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    drafting.clock.now = 0.3
    step(drafting, [5, 5], rejected=[1, 3])  # both verified 4 drafts: 10 target tokens
    assert fit.steps == [(2, 2, False, 0.1), (2, 10, True, 0.2)]


def test_cost_fit_switch_from_the_environment(monkeypatch):
    from dflash_plugin.step_costs import StepCostFit
    from vllm_ext.drafting import COST_FIT_ENV, cost_fit_from_env

    monkeypatch.delenv(COST_FIT_ENV, raising=False)
    assert cost_fit_from_env(CPU_COSTS) is None  # off by default
    monkeypatch.setenv(COST_FIT_ENV, "on")
    fit = cost_fit_from_env(CPU_COSTS)
    assert isinstance(fit, StepCostFit) and fit.prior == CPU_COSTS
    monkeypatch.setenv(COST_FIT_ENV, "maybe")
    with pytest.raises(ValueError, match="DFLASH_COST_FIT='maybe'"):
        cost_fit_from_env(CPU_COSTS)


def test_held_context_writes_are_left_out_of_the_step_that_flushes_them():
    """The draft pass flushes every context write held while drafting was off; timing that
    backlog as part of the drafted step would make drafting look slower the longer it was off."""

    class SlowQueue:
        def __init__(self, clock):
            self.clock = clock

        def flush(self, drafter):
            self.clock.now += 0.5  # a long backlog

    drafting, guard = make_drafting()
    drafting.deferred_context = SlowQueue(drafting.clock)
    step(drafting, [1, 1])
    drafting.skipped(2)
    drafting.clock.now = 0.1
    step(drafting, [1, 1], rejected=[0, 0])
    drafting.flush_context(drafter=None)  # before the draft pass: 0.1 -> 0.6
    drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    drafting.clock.now = 0.8
    step(drafting, [5, 5], rejected=[1, 3])
    assert guard.arm(2, True).rate == pytest.approx((2 + 8 - 4) / 0.2)  # not / 0.7
    drafting.skipped(2)
    drafting.clock.now = 0.9
    step(drafting, [1, 1])
    plain = guard.arm(2, False)  # the next plain step is timed whole again
    assert plain.samples == 2 and plain.rate == pytest.approx(20.0)
