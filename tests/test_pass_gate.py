"""The draft-pass gate: realised pass values per batch band, closing, re-opening, exploring."""

import math

import pytest
import torch

from dflash_plugin.draft_policy import CPU_COSTS, CostModel, DraftPolicy, PolicyMode
from dflash_plugin.pass_gate import PassGate, band_of

# A draft pass that costs 0.1 + 0.2 per request; a target step 1 + 0.1 per token.
COSTS = CostModel(verify_fixed=1.0, verify_per_token=0.1, draft_fixed=0.1, draft_per_request=0.2)


def test_bands_double():
    assert [band_of(b) for b in (1, 2, 3, 4, 7, 8, 15, 16, 31, 32)] == [1, 2, 2, 3, 3, 4, 4, 5,
                                                                        5, 6]


def test_pass_value_books_saved_time_against_the_pass_and_its_drafts():
    # batch 4: a token of a plain step costs (1 + 0.4) / 4 = 0.35; the pass 0.9; 6 drafts 0.6
    assert PassGate.pass_value(COSTS, 4, verified=6, accepted=5) == pytest.approx(
        5 * 0.35 - 0.9 - 0.6)
    assert PassGate.pass_value(COSTS, 1, verified=0, accepted=0) == pytest.approx(-0.3)


def test_losing_band_closes_with_every_band_above_it_and_not_below():
    gate = PassGate(min_passes=3)
    for _ in range(3):
        gate.record(COSTS, 1, verified=4, accepted=3)  # pays at one request
        assert gate.allows(COSTS, 1)
    for _ in range(2):
        gate.record(COSTS, 8, verified=0, accepted=0)  # passes that handed out nothing
    assert gate.allows(COSTS, 8)  # two passes are not yet evidence
    gate.record(COSTS, 8, verified=0, accepted=0)
    assert not gate.allows(COSTS, 8) and not gate.allows(COSTS, 12)
    assert not gate.allows(COSTS, 32)  # above a losing band: closed, never explored
    assert gate.allows(COSTS, 1) and gate.allows(COSTS, 4)
    assert "8-15 requests closed" in gate.summary() and "1 requests open" in gate.summary()


def test_closed_band_explores_once_within_its_share_of_time_then_recovers():
    gate = PassGate(min_passes=1, decay=0.5, explore_share=0.01)
    gate.record(COSTS, 16, verified=0, accepted=0)
    # wait = pass (0.1 + 3.2) / (1% of a step of 16 tokens, 2.6) = 127 asked steps
    wait = math.ceil(COSTS.draft_time(16) / (0.01 * COSTS.verify_time(16)))
    answers = [gate.allows(COSTS, 16) for _ in range(wait)]
    assert answers == [False] * (wait - 1) + [True]
    assert gate.vetoed == wait - 1
    # the explored pass pays (a drafter that improved: 100 drafts taken, 0.16 - 0.1 each, net
    # of the pass 2.95, against the earlier loss halved, -1.65): the band opens again
    gate.record(COSTS, 16, verified=100, accepted=100)
    assert gate.allows(COSTS, 16)


def test_waits_counts_sure_refusals_and_leaves_a_due_try_to_allows():
    gate = PassGate(min_passes=1, decay=0.5, explore_share=0.01)
    probe = COSTS.draft_time(16)
    assert not gate.waits(COSTS, 16, probe)  # an open band: a try may be granted
    gate.record(COSTS, 16, verified=0, accepted=0)
    wait = math.ceil(probe / (0.01 * COSTS.verify_time(16)))
    # the same schedule as asking `allows` every step: wait - 1 refused steps, then a try
    assert [gate.waits(COSTS, 16, probe) for _ in range(wait - 1)] == [True] * (wait - 1)
    assert not gate.waits(COSTS, 16, probe) and not gate.waits(COSTS, 16, probe)  # due: kept
    assert gate.allows(COSTS, 16)  # the caller's own ask grants it
    assert gate.bands[5].steps_closed == 0 and gate.waits(COSTS, 16, probe)
    # a refused try's own price sets the wait from then on (here ten times the probe)
    gate.bands[5].steps_closed = 0
    assert not gate.allows(COSTS, 16, probe=10 * probe)
    wait_10 = math.ceil(10 * probe / (0.01 * COSTS.verify_time(16)))
    answers = [gate.waits(COSTS, 16, probe) for _ in range(wait_10)]
    assert answers.index(False) == wait_10 - 2  # the refused ask above counted once
    # below a closed band nothing waits; above it everything does, without counting
    gate.record(COSTS, 4, verified=0, accepted=0)
    closed_steps = gate.bands[5].steps_closed
    assert gate.waits(COSTS, 20, probe) and gate.bands[5].steps_closed == closed_steps
    assert not gate.waits(COSTS, 2, probe)


def test_policy_consults_the_gate_and_spends_nothing_on_a_closed_band():
    policy = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, block=8)
    assert policy.should_draft(2)
    for _ in range(3):
        policy.pass_outcome(2, verified=0, accepted=0)
    assert not policy.should_draft(2) and not policy.should_draft(3)
    assert policy.should_draft(1)
    # modes other than adaptive neither book nor read the gate
    full = DraftPolicy(PolicyMode.FULL, CPU_COSTS, block=8)
    for _ in range(3):
        full.pass_outcome(2, verified=0, accepted=0)
    assert full.should_draft(2) and not full.gate.bands


def test_after_the_pass_its_cost_is_spent():
    # One request, drafts accepted 40% each: worth verifying once the pass has run, but not
    # worth a pass of this price in the first place.
    dear = CostModel(verify_fixed=1.0, verify_per_token=0.05, draft_fixed=0.5,
                     draft_per_request=0.5)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, dear, block=4)
    gains = torch.cumprod(torch.full((1, 4), 0.4, dtype=torch.float64), dim=-1)
    from dflash_plugin.draft_policy import plan_draft_lengths

    assert plan_draft_lengths(gains, dear) == [0]
    assert policy.plan(gains)[0] > 0
