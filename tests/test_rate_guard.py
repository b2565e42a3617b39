"""The measured-rate guards (per step and per window) on their own, and the draft policy that
consults them (no engine)."""

import pytest
import torch

from dflash_plugin.draft_policy import CPU_COSTS, DraftPolicy, PolicyMode
from dflash_plugin.rate_guard import RateGuard, WindowGuard, batch_bucket

BLOCK = 15


def test_batch_buckets_group_similar_batch_sizes():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 7, 8, 16, 31, 32)] == [1, 2, 2, 3, 3, 4, 5, 5, 6]


def test_drafting_loses_only_once_both_arms_are_measured_and_drafting_is_slower():
    guard = RateGuard(min_samples=2, smoothing=0.5)
    assert not guard.drafting_loses(4) and guard.speedup(4) is None
    for _ in range(2):
        guard.record(4, drafted=False, tokens=4, seconds=0.04)  # 100 tok/s
    guard.record(4, drafted=True, tokens=6, seconds=0.1)  # 60 tok/s, one sample only
    assert not guard.drafting_loses(4)
    guard.record(5, drafted=True, tokens=6, seconds=0.1)  # same bucket (4-7)
    assert guard.drafting_loses(6)
    assert guard.speedup(4) == pytest.approx(0.6)
    assert not guard.drafting_loses(8)  # another bucket: nothing measured there
    for _ in range(10):  # the drafter got better: drafted steps now emit 150 tok/s
        guard.record(4, drafted=True, tokens=15, seconds=0.1)
    assert not guard.drafting_loses(4)
    assert guard.speedup(4) > 1.4


def test_plain_steps_are_asked_for_first_then_again_after_a_long_drafted_run():
    guard = RateGuard(min_samples=2, refresh_plain_every=5)
    assert guard.needs_plain_sample(1)
    guard.record(1, drafted=False, tokens=1, seconds=0.02)
    assert guard.needs_plain_sample(1)
    guard.record(1, drafted=False, tokens=1, seconds=0.02)
    assert not guard.needs_plain_sample(1)
    for _ in range(5):
        guard.record(1, drafted=True, tokens=3, seconds=0.04)
    assert guard.needs_plain_sample(1)
    guard.record(1, drafted=False, tokens=1, seconds=0.02)
    assert not guard.needs_plain_sample(1)


def test_no_endless_plain_requests_where_no_step_can_be_timed():
    guard = RateGuard(min_samples=2)
    asks = [guard.needs_plain_sample(1) for _ in range(20)]
    assert asks == [True] * guard.max_plain_asks + [False] * (20 - guard.max_plain_asks)


def test_bad_measurements_are_ignored_and_bad_settings_refused():
    guard = RateGuard(min_samples=1)
    guard.record(1, drafted=False, tokens=1, seconds=0.0)
    guard.record(0, drafted=False, tokens=1, seconds=1.0)
    assert guard.arm(1, False).samples == 0
    with pytest.raises(ValueError, match="min_samples"):
        RateGuard(min_samples=0)
    with pytest.raises(ValueError, match="smoothing"):
        RateGuard(smoothing=0)


def test_policy_stops_drafting_where_it_is_timed_slower_and_probes_rarely():
    guard = RateGuard(min_samples=2)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, rate_guard=guard, probe_every=5)
    assert not policy.should_draft(1)  # plain steps first, to know what drafting must beat
    guard.record(1, drafted=False, tokens=1, seconds=0.02)  # 50 tok/s
    guard.record(1, drafted=False, tokens=1, seconds=0.02)
    assert policy.should_draft(1)  # the cost model, optimistic for a new drafter, says yes
    guard.record(1, drafted=True, tokens=2, seconds=0.05)  # 40 tok/s: drafting loses
    guard.record(1, drafted=True, tokens=2, seconds=0.05)
    decisions = [policy.should_draft(1) for _ in range(15)]
    # a probe after 5 vetoed steps; each probe that leaves the veto in place doubles the gap
    assert [i for i, d in enumerate(decisions) if d] == [4, 14]
    assert policy.should_draft(64) is False  # another batch bucket: plain samples first
    for _ in range(20):  # probes show a drafter that now pays off (100 tok/s)
        guard.record(1, drafted=True, tokens=5, seconds=0.05)
    assert policy.should_draft(1)


def test_policy_without_a_guard_or_in_fixed_modes_ignores_timings():
    guard = RateGuard(min_samples=1)
    guard.record(1, drafted=False, tokens=1, seconds=0.01)
    guard.record(1, drafted=True, tokens=1, seconds=1.0)
    assert DraftPolicy(PolicyMode.FULL, CPU_COSTS, BLOCK, rate_guard=guard).should_draft(1)
    assert DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK).should_draft(1)
    confidence = torch.full((1, BLOCK), 0.99)
    assert DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK,
                       rate_guard=guard).choose(1, confidence, BLOCK)[0] > 0


def _decode(policy, steps, drafted_step, plain_step, batch=1):
    """Run `steps` timed steps; *_step = (tokens, seconds). Returns which steps drafted."""
    drafted = []
    for _ in range(steps):
        ran = policy.should_draft(batch)
        tokens, seconds = drafted_step if ran else plain_step
        policy.record_step(batch, batch, tokens, ran, seconds)
        drafted.append(ran)
    return drafted


def test_window_guard_keeps_the_faster_arm_and_explores_the_other_one_window_in_eight():
    window = 10
    slow = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK,
                       window_guard=WindowGuard(window=window, explore_every=8))
    assert slow.times_steps
    # Drafted steps emit 2 tokens in 50 ms (40 tok/s), plain ones 1 in 20 ms (50 tok/s).
    drafted = _decode(slow, 2000, (2, 0.05), (1, 0.02))
    windows = [drafted[i:i + window] for i in range(0, 2000, window)]
    assert all(len(set(w)) == 1 for w in windows)  # an arm holds for a whole window
    arms = [w[0] for w in windows]
    assert arms[:4] == [True, False, True, False]  # both arms measured first
    assert sum(arms[4:]) == len(arms[4:]) // 8  # then "on" only as every 8th window
    assert slow.window_guard.speedups_by_bucket() == {1: pytest.approx(0.8)}

    fast = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK,
                       window_guard=WindowGuard(window=window, explore_every=8))
    drafted = _decode(fast, 2000, (5, 0.05), (1, 0.02))  # 100 tok/s drafted
    assert sum(drafted[400:]) == pytest.approx(1600 * 7 / 8, abs=window)


def test_window_guard_follows_a_change_and_keeps_batch_buckets_apart():
    guard = WindowGuard(window=5, explore_every=4, decay=0.5)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, window_guard=guard)
    early = _decode(policy, 300, (2, 0.05), (1, 0.02))  # drafting loses at batch 1
    assert sum(early[-100:]) == 25  # "on" only in exploration windows (1 in 4)
    later = _decode(policy, 300, (5, 0.05), (1, 0.02))  # the drafter now pays off
    assert sum(later[-100:]) == 75  # found by an exploration window, and kept
    assert guard.arm(64, True).windows == 0  # batch 1's verdict says nothing about batch 64
    heavy = _decode(policy, 100, (40, 0.5), (64, 0.5), batch=64)  # drafting loses at 64
    assert guard.arm(64, True).windows >= 2 and guard.arm(64, False).windows >= 2
    assert sum(heavy[-50:]) <= 15
    back = _decode(policy, 20, (5, 0.05), (1, 0.02))  # batch 1 kept its own verdict:
    assert sum(back[5:]) >= 10  # after the window left open at batch 64, 2 of 3 windows "on"


def test_window_guard_ignores_bad_steps_and_refuses_bad_settings():
    guard = WindowGuard(window=2)
    guard.record(1, 1, 0.01)  # no window open yet: nothing to charge it to
    assert guard.allows_drafting(1)
    guard.record(1, 0, 0.01)
    guard.record(1, 1, 0.0)
    assert guard.arm(1, True).windows == 0 and guard.allows_drafting(1)
    for bad in (dict(window=0), dict(explore_every=1), dict(decay=0.0), dict(margin=0)):
        with pytest.raises(ValueError, match="window guard"):
            WindowGuard(**bad)
