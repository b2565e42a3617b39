"""The cost model re-fitted from timed steps (dflash_plugin/step_costs.py), and the draft policy
that plans with it (no engine: steps are timed from a known cost model plus noise)."""

import random

import pytest
import torch

from dflash_plugin.draft_policy import CPU_COSTS, CostModel, DraftPolicy, PolicyMode
from dflash_plugin.step_costs import StepCostFit

# What the "machine" really costs, in seconds: a draft pass far dearer than the preset says
# (0.6 of a plain step instead of 0.27), extra verified tokens cheaper (0.03 instead of 0.09).
TRUE = CostModel(verify_fixed=0.0194, verify_per_token=0.0006, draft_fixed=0.010,
                 draft_per_request=0.002)
PLAIN_STEP = TRUE.verify_fixed + TRUE.verify_per_token  # one request, no drafts


def step_seconds(costs, batch, target_tokens, drafted):
    return (costs.verify_time(target_tokens) + (costs.draft_time(batch) if drafted else 0.0))


def run_steps(fit, costs, count, rng, batches=(1, 2, 4, 8), noise=0.1):
    for _ in range(count):
        batch = rng.choice(batches)
        drafted = rng.random() < 0.5
        tokens = batch + (rng.randint(0, 15) * batch if drafted else 0)
        seconds = step_seconds(costs, batch, tokens, drafted) * (1 + rng.uniform(-noise, noise))
        fit.record(batch, tokens, drafted, seconds)


def relative(costs):
    unit = costs.verify_fixed + costs.verify_per_token
    return [costs.verify_fixed / unit, costs.verify_per_token / unit, costs.draft_fixed / unit,
            costs.draft_per_request / unit]


def test_fit_recovers_the_machines_costs_from_noisy_steps():
    fit = StepCostFit(CPU_COSTS)
    assert fit.costs == CPU_COSTS  # nothing measured yet: the preset
    run_steps(fit, TRUE, 600, random.Random(0))
    assert fit.costs.verify_per_token == pytest.approx(relative(TRUE)[1], rel=0.15)
    assert fit.costs.draft_fixed == pytest.approx(relative(TRUE)[2], rel=0.1)
    assert fit.costs.draft_per_request == pytest.approx(relative(TRUE)[3], rel=0.15)
    assert fit.costs.verify_fixed + fit.costs.verify_per_token == pytest.approx(1.0)
    assert fit.seconds_per_plain_step == pytest.approx(PLAIN_STEP, rel=0.05)
    assert fit.costs.min_speedup == CPU_COSTS.min_speedup  # only the step costs are fitted


def test_at_batch_one_the_draft_pass_total_is_learnt():
    fit = StepCostFit(CPU_COSTS)
    run_steps(fit, TRUE, 400, random.Random(1), batches=(1,))
    # At batch 1 the fixed and per-request parts of a draft pass are one number: its total.
    draft_at_one = fit.costs.draft_fixed + fit.costs.draft_per_request
    assert draft_at_one == pytest.approx(sum(relative(TRUE)[2:]), rel=0.1)
    assert fit.costs.verify_per_token == pytest.approx(relative(TRUE)[1], rel=0.15)


def fit_after_a_stall(**settings):
    rng = random.Random(2)
    fit = StepCostFit(CPU_COSTS, **settings)
    run_steps(fit, TRUE, 300, rng, noise=0.0)
    before = fit.costs
    fit.record(1, 1, False, 100 * PLAIN_STEP)  # the machine stalled for 100 plain steps
    run_steps(fit, TRUE, fit.refit_every, rng, noise=0.0)
    return before, fit


def test_a_stalled_step_barely_moves_the_fit():
    before, fit = fit_after_a_stall()
    assert fit.costs.draft_fixed == pytest.approx(before.draft_fixed, rel=0.05)
    assert fit.seconds_per_plain_step == pytest.approx(PLAIN_STEP, rel=0.05)
    # Unclipped, that one step would have erased the draft pass's cost from the fit.
    _, unclipped = fit_after_a_stall(max_ratio=1e9)
    assert unclipped.costs.draft_fixed < 0.5 * before.draft_fixed


def test_old_steps_are_forgotten_when_the_costs_change():
    rng = random.Random(3)
    fit = StepCostFit(CPU_COSTS)
    run_steps(fit, TRUE, 400, rng)
    cheap_drafts = CostModel(verify_fixed=TRUE.verify_fixed, verify_per_token=TRUE.verify_per_token,
                             draft_fixed=0.002, draft_per_request=0.0005)
    run_steps(fit, cheap_drafts, 3000, rng)
    assert fit.costs.draft_fixed == pytest.approx(relative(cheap_drafts)[2], rel=0.2)


def test_invalid_steps_are_ignored_and_bad_settings_refused():
    fit = StepCostFit(CPU_COSTS, warmup_steps=1)
    for batch, tokens, seconds in ((0, 1, 0.01), (2, 1, 0.01), (1, 1, 0.0), (1, 1, float("nan"))):
        assert not fit.record(batch, tokens, False, seconds)
    assert fit.steps_seen == 0 and fit.seconds_per_plain_step is None
    for bad in ({"prior_steps": 0}, {"forget": 0}, {"forget": 1.5}, {"warmup_steps": 0},
                {"refit_every": 0}, {"max_ratio": 1.0}):
        with pytest.raises(ValueError, match="step cost fit"):
            StepCostFit(CPU_COSTS, **bad)


def test_the_policy_plans_with_the_fitted_costs():
    """The preset says a 3-draft verify pays at 70% per-draft acceptance; on a machine whose
    draft pass costs 1.5 plain steps it does not, and the fitted policy stops drafting; where
    the draft pass is nearly free it drafts more than the preset would."""
    confidence = torch.full((1, 15), 0.7)
    preset = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, block=15)
    preset_lengths = preset.choose(1, confidence, 15)
    assert preset_lengths[0] > 0

    def fitted_policy(machine):
        policy = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, block=15,
                             cost_fit=StepCostFit(CPU_COSTS))
        assert policy.times_steps
        rng = random.Random(4)
        for _ in range(300):
            batch, drafted = rng.choice((1, 2, 4)), rng.random() < 0.5
            tokens = batch + (rng.randint(0, 15) * batch if drafted else 0)
            seconds = step_seconds(machine, batch, tokens, drafted)
            policy.record_step(batch, tokens, tokens, drafted, seconds)
        return policy

    slow_drafts = CostModel(verify_fixed=0.019, verify_per_token=0.001, draft_fixed=0.03,
                            draft_per_request=0.0)
    assert fitted_policy(slow_drafts).choose(1, confidence, 15) == [0]
    free_drafts = CostModel(verify_fixed=0.019, verify_per_token=0.0002, draft_fixed=0.0005,
                            draft_per_request=0.0)
    assert fitted_policy(free_drafts).choose(1, confidence, 15)[0] > preset_lengths[0]
