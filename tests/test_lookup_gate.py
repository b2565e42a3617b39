"""The lookup gate: lookup-only steps booked by their time against draft-free steps of the same
batch size, bands closing where they lose, and the n-gram planner obeying it."""

import numpy as np
import pytest
import torch

from dflash_plugin.draft_policy import CostModel, DraftPolicy, PolicyMode
from dflash_plugin.lookup_gate import DraftFreeSteps, LookupGate
from dflash_plugin.ngram import NgramDrafts, NgramMatch

# A target step 1 + 0.02 per token: a lookup token looks nearly free to the model.
COSTS = CostModel(verify_fixed=1.0, verify_per_token=0.02, draft_fixed=0.3,
                  draft_per_request=0.1)


def test_reference_is_the_median_of_recent_draft_free_steps_of_that_batch():
    steps = DraftFreeSteps(keep=4, min_samples=3)
    steps.add(16, 50.0)
    steps.add(16, 70.0)
    assert steps.reference(16) is None  # too few yet
    steps.add(16, 60.0)
    assert steps.reference(16) == 60.0
    for ms in (100.0, 100.0, 100.0):  # only the newest `keep` count
        steps.add(16, ms)
    assert steps.reference(16) == 100.0
    assert steps.reference(15) is None  # another batch size has its own


def gate_with_reference(batch: int, ms: float) -> LookupGate:
    gate = LookupGate()
    for _ in range(5):
        gate.draft_free_step(batch, ms)
    return gate


def test_a_lookup_step_is_worth_its_tokens_less_its_measured_extra_time():
    gate = gate_with_reference(32, 100.0)
    # 32 requests: a token is worth 100/32 ms; the step took 20 ms more and brought 4 tokens
    gate.lookup_step(COSTS, 32, verified=12, accepted=4, ms=120.0)
    rec = gate.gate.bands[6]
    assert rec.net == pytest.approx(4 / 32 - 0.2)
    assert gate.timed == 1 and gate.priced == 0
    gate.lookup_step(COSTS, 32, verified=12, accepted=4, ms=400.0)  # an idle gap: not booked
    assert rec.passes == 1


def test_without_a_reference_the_cost_model_prices_the_extra_tokens():
    gate = LookupGate()
    gate.lookup_step(COSTS, 8, verified=10, accepted=1, ms=30.0)
    plain = COSTS.verify_time(8)
    assert gate.gate.bands[4].net == pytest.approx((plain / 8 - 0.02 * 10) / plain)
    assert gate.priced == 1 and gate.timed == 0


def test_steps_that_cost_more_than_they_bring_close_their_band_and_those_above():
    gate = gate_with_reference(16, 80.0)
    gate_small = gate_with_reference(2, 40.0)
    assert gate.allows(COSTS, 16, 8)
    for _ in range(6):  # the model calls these free; the clock says +15% for 1 token in 16
        gate.lookup_step(COSTS, 16, verified=8, accepted=1, ms=92.0 + np.random.default_rng(0).random())
    assert gate.closed(16) and gate.closed(32) and not gate.closed(8)
    assert not gate.allows(COSTS, 20, 8)
    assert "16-31 requests closed" in gate.summary() and "6 timed" in gate.summary()
    # where lookup pays for its time the band stays open
    for _ in range(6):
        gate_small.lookup_step(COSTS, 2, verified=6, accepted=4, ms=44.0)
    assert not gate_small.closed(2) and gate_small.allows(COSTS, 2, 6)


def test_a_closed_band_is_explored_within_its_share_of_time():
    gate = gate_with_reference(16, 80.0)
    for _ in range(3):
        gate.lookup_step(COSTS, 16, verified=8, accepted=0, ms=100.0)
    # a try of 8 tokens costs 0.16 units: one in every 0.16 / (0.5% of a 1.32-unit step) = 25
    answers = [gate.allows(COSTS, 16, 8) for _ in range(100)]
    assert [i for i, yes in enumerate(answers) if yes] == [24, 49, 74, 99]


def copying_history():
    prompt = list(range(10, 40))
    return np.array(prompt + [3] + prompt[:5])  # the answer copies the prompt


def test_the_planner_runs_no_lookup_only_step_in_a_closed_band():
    policy = DraftPolicy(PolicyMode.ADAPTIVE, COSTS, block=8)
    ngram = NgramDrafts(8)
    for _ in range(50):  # lookup has been accepted in full
        ngram.calibration.observe([4], [8], [8])
    matches = ngram.find([copying_history()] * 16, 8)
    assert all(isinstance(m, NgramMatch) for m in matches)
    lengths = ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False)
    assert lengths is not None and sum(lengths) > 0
    for _ in range(5):
        ngram.gate.draft_free_step(16, 80.0)
        ngram.gate.draft_free_step(1, 30.0)
    for _ in range(4):
        ngram.gate.lookup_step(COSTS, 16, verified=64, accepted=2, ms=140.0)
    before = ngram.counts.steps_without_draft_pass
    vetoed = [ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False)
              for _ in range(20)]
    assert vetoed.count(None) >= 19
    assert ngram.counts.steps_without_draft_pass - before == 20 - vetoed.count(None)
    # one request alone is another band: lookup still runs there
    assert ngram.plan_without_draft_pass(policy, matches[:1], 8, drafter_runs=False)


def test_mixing_lookup_into_a_draft_pass_is_not_this_gates_business():
    ngram = NgramDrafts(8)
    for _ in range(5):
        ngram.gate.draft_free_step(4, 50.0)
    for _ in range(4):
        ngram.gate.lookup_step(COSTS, 4, verified=16, accepted=0, ms=70.0)
    assert ngram.gate.closed(4)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, COSTS, block=8)
    for _ in range(50):
        ngram.calibration.observe([4], [8], [8])
    matches = ngram.find([copying_history()] * 4, 8)
    drafter = torch.full((4, 8), 0.01, dtype=torch.float64)
    _, take = ngram.choose(policy, drafter, matches)
    assert all(take)  # after a pass the lookup may still win per request (the pass gate books it)


def test_a_batch_size_without_a_fresh_reference_gets_draft_free_steps_first():
    """Under load nearly every step verifies some lookup draft, so a batch size may never see
    a draft-free step and its lookup steps would all be priced by the model, which misses a
    drafted step's fixed cost. While steps are timed, such a batch size is left draft-free
    until it has a reference, and again after REFRESH lookup steps booked against one."""
    from dflash_plugin.lookup_gate import REFRESH

    policy = DraftPolicy(PolicyMode.ADAPTIVE, COSTS, block=8)
    ngram = NgramDrafts(8)
    for _ in range(50):
        ngram.calibration.observe([4], [8], [8])
    matches = ngram.find([copying_history()] * 32, 8)
    # never timed (a tensor-parallel engine): the model prices, nothing is held back
    assert ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False)
    assert ngram.gate.references == 0
    ngram.gate.draft_free_step(4, 40.0)  # steps are timed here, at another batch size
    plans = []
    for _ in range(3):
        plans.append(ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False))
        ngram.gate.draft_free_step(32, 100.0)  # the step left draft-free, timed
    assert plans == [None] * 3 and ngram.gate.references == 3
    assert ngram.gate.draft_free.reference(32) == 100.0
    for _ in range(REFRESH):
        assert ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False)
        ngram.gate.lookup_step(COSTS, 32, verified=64, accepted=40, ms=110.0)
    assert ngram.gate.timed == REFRESH and ngram.gate.priced == 0
    assert ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False) is None
    ngram.gate.draft_free_step(32, 100.0)  # one fresh sample renews the reference
    assert ngram.plan_without_draft_pass(policy, matches, 8, drafter_runs=False)
    assert "4 left draft-free for a reference" in ngram.gate.summary()
