"""The cost model fitted to measured step times, and the CUDA preset built from a GPU table."""

import json

import pytest
import torch

from dflash_plugin.draft_policy import CUDA_COSTS, CostModel, plan_draft_lengths
from dflash_plugin.measured_costs import (
    CUDA_TIMINGS_FILE,
    StepTimings,
    cuda_costs,
    fit_cost_model,
    read_timings,
)


def synthetic(fixed=1.0, per_token=0.05, draft_fixed=0.2, per_request=0.03, plain_ms=10.0):
    costs = CostModel(verify_fixed=fixed, verify_per_token=per_token, draft_fixed=draft_fixed,
                      draft_per_request=per_request)
    unit = plain_ms / costs.verify_time(1)
    verify = {(b, n): unit * costs.verify_time(b * n) for b in (1, 2, 4, 8) for n in (1, 4, 16)}
    draft = {b: unit * costs.draft_time(b) for b in (1, 2, 4, 8)}
    return costs, StepTimings(verify, draft)


def test_fit_recovers_a_linear_model_in_plain_step_units():
    costs, timings = synthetic()
    fitted = fit_cost_model(timings)
    scale = costs.verify_time(1)  # the fit's unit is the plain step itself
    assert fitted.verify_fixed == pytest.approx(costs.verify_fixed / scale, rel=1e-6)
    assert fitted.verify_per_token == pytest.approx(costs.verify_per_token / scale, rel=1e-6)
    assert fitted.draft_fixed == pytest.approx(costs.draft_fixed / scale, rel=1e-6)
    assert fitted.draft_per_request == pytest.approx(costs.draft_per_request / scale, rel=1e-6)
    assert fitted.verify_time(1) == pytest.approx(1.0)


def test_fit_keeps_the_base_models_speedup_bars():
    _, timings = synthetic()
    base = CostModel(1.0, 0.1, 0.1, 0.1, min_speedup=1.2, min_speedup_batched=1.4)
    fitted = fit_cost_model(timings, base)
    assert (fitted.min_speedup, fitted.min_speedup_batched) == (1.2, 1.4)


def test_times_that_fall_with_size_give_a_flat_non_negative_model():
    timings = StepTimings({(1, 1): 10.0, (1, 16): 9.0, (4, 16): 8.0}, {1: 2.0, 8: 1.0})
    fitted = fit_cost_model(timings)
    assert fitted.verify_per_token == 0.0 and fitted.draft_per_request == 0.0
    assert 0.8 < fitted.verify_fixed < 1.0


@pytest.mark.parametrize("verify, draft, message", [
    ({(2, 1): 5.0}, {1: 1.0, 2: 2.0}, "plain single-request step"),
    ({(1, 1): 5.0}, {1: 1.0}, "two or more batch sizes"),
    ({(1, 1): 5.0}, {1: 1.0, 2: -2.0}, "not a positive time"),
])
def test_incomplete_or_bad_timings_are_refused(verify, draft, message):
    with pytest.raises(ValueError, match=message):
        StepTimings(verify, draft)


def test_draft_depths_between_and_beyond_the_measured_ones(tmp_path):
    table = {"target_ms": {"1x1": 10.0, "2x1": 11.0},
             "draft_ms": {"1x1": 1.0, "2x1": 1.5, "1x3": 3.0, "2x3": 4.5}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    assert read_timings(path, 1).draft_ms == {1: 1.0, 2: 1.5}
    assert read_timings(path, 2).draft_ms == {1: pytest.approx(2.0), 2: pytest.approx(3.0)}
    assert read_timings(path, 5).draft_ms == {1: pytest.approx(5.0), 2: pytest.approx(7.5)}
    with pytest.raises(ValueError, match="at least one layer"):
        read_timings(path, 0)


def test_cuda_preset_is_the_fit_of_the_shipped_gpu_table():
    table = json.loads(CUDA_TIMINGS_FILE.read_text())
    assert table["device"].startswith("NVIDIA")
    costs = cuda_costs(5)
    # A memory-bound GPU: 16 verified tokens cost a few percent of a step, a draft pass a
    # fraction of one; deeper drafters cost more.
    assert costs.verify_time(16) < 1.1 * costs.verify_time(1)
    assert 0 < costs.draft_time(1) < 0.5
    assert cuda_costs(8).draft_time(1) > costs.draft_time(1) > cuda_costs(1).draft_time(1)
    # Every fitted step is within 25% of what was measured.
    timings = read_timings(CUDA_TIMINGS_FILE, 5)
    for (batch, length), ms in timings.verify_ms.items():
        assert costs.verify_time(batch * length) == pytest.approx(ms / timings.plain_ms, rel=0.25)


def test_cuda_preset_drafts_whole_blocks_alone_and_less_under_load():
    costs = cuda_costs(5)
    sure = plan_draft_lengths(torch.full((1, 15), 0.9, dtype=torch.float64), costs)
    assert sure == [15]
    unsure = plan_draft_lengths(torch.full((64, 15), 0.05, dtype=torch.float64), costs)
    assert sum(unsure) < 64 * 15


def test_the_named_cuda_preset_is_the_rounded_fit():
    fitted = cuda_costs(5)
    for name in ("verify_fixed", "verify_per_token", "draft_fixed", "draft_per_request"):
        assert getattr(CUDA_COSTS, name) == pytest.approx(getattr(fitted, name), rel=0.02), name
