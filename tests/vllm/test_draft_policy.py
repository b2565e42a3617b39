"""The load-aware drafting policy on its own (no engine)."""

from dataclasses import replace

import pytest
import torch

from dflash_plugin.draft_policy import (
    CPU_COSTS,
    CUDA_COSTS,
    VLLM_CPU_COSTS,
    VLLM_CPU_SOFTWARE_BF16_COSTS,
    ConfidenceCalibration,
    CostModel,
    DraftPolicy,
    PolicyMode,
    cumulative_acceptance,
    parse_cost_model,
    plan_draft_lengths,
    vllm_cpu_costs,
    vllm_cpu_fp32_costs,
    vllm_cpu_preset,
)
from dflash_plugin.measured_costs import cuda_costs

BLOCK = 15


def plan(batch: int, acceptance: float, costs: CostModel = CPU_COSTS) -> list[int]:
    gains = cumulative_acceptance(torch.full((batch, BLOCK), acceptance))
    return plan_draft_lengths(gains, costs)


def test_full_block_for_one_confident_request():
    assert plan(1, 0.97) == [BLOCK]


def test_no_drafts_when_the_gain_does_not_pay_for_them():
    assert plan(1, 0.02) == [0]
    assert plan(32, 0.6) == [0] * 32


@pytest.mark.parametrize("costs", [CPU_COSTS, VLLM_CPU_COSTS, CUDA_COSTS])
@pytest.mark.parametrize("acceptance", [0.5, 0.7, 0.85, 0.95])
def test_drafts_shrink_as_the_batch_grows(costs, acceptance):
    per_request = [max(plan(batch, acceptance, costs)) for batch in (1, 2, 4, 8, 16, 32, 64)]
    assert per_request == sorted(per_request, reverse=True)


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_drafts_grow_with_confidence(batch):
    lengths = [max(plan(batch, p)) for p in (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99)]
    assert lengths == sorted(lengths)
    assert lengths[-1] > 0


def test_confident_requests_get_longer_drafts_than_unsure_ones():
    acceptance = torch.tensor([[0.95] * BLOCK, [0.5] * BLOCK, [0.05] * BLOCK])
    lengths = plan_draft_lengths(cumulative_acceptance(acceptance), CPU_COSTS)
    assert lengths[0] > lengths[1] > lengths[2] == 0


def test_each_request_gets_a_prefix_even_on_ties():
    acceptance = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    assert plan_draft_lengths(cumulative_acceptance(acceptance), CPU_COSTS) == [2]


def test_plan_never_beats_plain_by_less_than_the_margin():
    costs = CPU_COSTS
    for batch in (1, 4, 16, 32):
        for p in (0.3, 0.6, 0.8, 0.95):
            lengths = plan(batch, p, costs)
            if not any(lengths):
                continue
            gains = cumulative_acceptance(torch.full((BLOCK,), p))
            tokens = sum(1 + float(gains[:k].sum()) for k in lengths)
            time = costs.verify_time(batch + sum(lengths)) + costs.draft_time(batch)
            assert tokens / time >= costs.speedup_bar(batch) * batch / costs.verify_time(batch)


def test_batched_bar_applies_from_two_requests_on():
    strict = replace(CPU_COSTS, min_speedup_batched=1.6)
    assert strict.speedup_bar(1) == CPU_COSTS.min_speedup and strict.speedup_bar(2) == 1.6
    # A lone request drafts exactly as before; a batch that drafts under the common bar of
    # 1.05 stops once its expected gain falls short of the batched one.
    for p in (0.6, 0.8, 0.95):
        assert plan(1, p, strict) == plan(1, p, CPU_COSTS)
    assert any(plan(4, 0.8, CPU_COSTS)) and not any(plan(4, 0.8, strict))
    assert parse_cost_model("min_speedup_batched=1.2", CPU_COSTS).min_speedup_batched == 1.2


def test_cost_model_override_and_errors():
    costs = parse_cost_model("verify_per_token=0.5, draft_fixed=0", CPU_COSTS)
    assert costs.verify_per_token == 0.5 and costs.draft_fixed == 0
    assert costs.draft_per_request == CPU_COSTS.draft_per_request
    assert parse_cost_model("", CPU_COSTS) == CPU_COSTS
    with pytest.raises(ValueError, match="verify_speed"):
        parse_cost_model("verify_speed=1", CPU_COSTS)
    with pytest.raises(ValueError, match="not a number"):
        parse_cost_model("draft_fixed=fast", CPU_COSTS)
    with pytest.raises(ValueError, match=">= 0"):
        parse_cost_model("draft_fixed=-1", CPU_COSTS)


def test_calibration_learns_an_overconfident_drafter():
    calibration = ConfidenceCalibration()
    confident = torch.tensor([0.95, 0.95, 0.95])
    assert float(calibration(confident)[0]) > 0.9
    for _ in range(200):  # the first draft is always rejected
        calibration.observe([confident], [0])
    assert float(calibration(confident)[0]) < 0.2
    # Positions after the first rejection were never judged: other bins keep their prior.
    assert abs(float(calibration(torch.tensor([0.55]))[0]) - 0.55) < 1e-6


def test_calibration_counts_accepted_prefix_and_first_rejection_only():
    calibration = ConfidenceCalibration(num_bins=2, prior_weight=1.0, decay=1.0)
    calibration.observe([torch.tensor([0.9, 0.9, 0.2, 0.2])], [2])
    # high bin: prior 0.75/1 + 2 accepted of 2; low bin: prior 0.25/1 + 0 of 1 (4th unseen)
    assert torch.allclose(calibration(torch.tensor([0.9, 0.2])),
                          torch.tensor([2.75 / 3, 0.25 / 2], dtype=torch.float64))


def test_policy_skips_the_draft_pass_for_a_useless_drafter_then_explores():
    policy = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK, explore_every=4)
    assert policy.should_draft(1)  # optimistic start: try the drafter
    for _ in range(40):  # it is useless: the learnt curve collapses
        assert policy.choose(1, torch.full((1, BLOCK), 1e-4), BLOCK) == [0]
    decisions = [policy.should_draft(1) for _ in range(8)]
    assert decisions == [False, False, False, True] * 2
    # Under heavy load even a good drafter would not pay: never explore there.
    assert not any(policy.should_draft(256) for _ in range(20))


def test_policy_modes():
    confidence = torch.full((3, BLOCK), 0.99)
    off = DraftPolicy(PolicyMode.OFF, CPU_COSTS, BLOCK)
    assert not off.should_draft(1) and off.choose(3, confidence, BLOCK) == [0, 0, 0]
    full = DraftPolicy(PolicyMode.FULL, CPU_COSTS, BLOCK)
    assert full.should_draft(64) and full.choose(3, None, BLOCK) == [BLOCK] * 3
    adaptive = DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK)
    assert adaptive.choose(2, None, 7) == [7, 7]  # no confidences reported: vLLM's behaviour


def test_batch_size_schedule_for_engines_without_per_request_lengths():
    from dflash_plugin.draft_policy import batch_size_schedule

    schedule = batch_size_schedule(CPU_COSTS, BLOCK, max_batch=64, acceptance=0.8)
    assert schedule[0][0] == 1 and schedule[-1][1] == 64
    assert all(a[1] + 1 == b[0] for a, b in zip(schedule, schedule[1:]))  # contiguous
    ks = [k for _, _, k in schedule]
    assert ks == sorted(ks, reverse=True) and ks[0] > 0 and ks[-1] == 0


def test_the_vllm_adapter_takes_its_platforms_preset(monkeypatch):
    from dataclasses import replace

    from vllm_ext.drafting import cost_model_from_env

    monkeypatch.delenv("DFLASH_COST_MODEL", raising=False)
    assert cost_model_from_env(is_cpu=True) == VLLM_CPU_COSTS
    assert cost_model_from_env(is_cpu=False) == cuda_costs(5)
    monkeypatch.setenv("DFLASH_COST_MODEL", "draft_fixed=0.5")
    assert cost_model_from_env(is_cpu=True) == replace(VLLM_CPU_COSTS, draft_fixed=0.5)
    # The CPU preset follows the drafter's depth; an override still wins over it.
    assert cost_model_from_env(is_cpu=True, num_draft_layers=8) == replace(vllm_cpu_costs(8),
                                                                          draft_fixed=0.5)
    assert cost_model_from_env(is_cpu=False, num_draft_layers=8) == replace(cuda_costs(8),
                                                                           draft_fixed=0.5)


def test_cpu_preset_scales_the_draft_pass_with_the_drafters_depth():
    assert vllm_cpu_costs(None) == vllm_cpu_costs(5) == VLLM_CPU_COSTS
    shallow, deep = vllm_cpu_costs(2), vllm_cpu_costs(8)
    for batch in (1, 4, 16):
        assert shallow.draft_time(batch) < VLLM_CPU_COSTS.draft_time(batch) < deep.draft_time(batch)
    assert deep.verify_time(7) == VLLM_CPU_COSTS.verify_time(7)  # the target's side is unchanged
    # A dearer draft pass stops paying at a lower load: two requests at acceptance 0.5 get
    # drafts from the 5-layer preset and none from the 8-layer one.
    assert max(plan(2, 0.5, VLLM_CPU_COSTS)) > 0
    assert plan(2, 0.5, deep) == [0, 0]
    assert vllm_cpu_costs(1).draft_per_request > 0
    for bad in (0, -3, 2.5, "8"):
        with pytest.raises(ValueError, match="num_draft_layers"):
            vllm_cpu_costs(bad)


def test_compiled_vllm_cpu_preset_drafts_at_low_load_only():
    # What the compiled vLLM-CPU costs imply for a drafter accepting ~half its drafts (the
    # shipped one on the bench prompts): short drafts for one request, none under load.
    assert 0 < max(plan(1, 0.5, VLLM_CPU_COSTS)) <= 4
    assert plan(16, 0.5, VLLM_CPU_COSTS) == [0] * 16


@pytest.mark.parametrize("native", [True, False, None])
def test_the_cpu_preset_follows_how_the_target_computes(native):
    # float32 on any CPU: the float32 preset for the engine's draft length
    assert vllm_cpu_preset(8, 16, torch.float32, native) == vllm_cpu_fp32_costs(16)
    # 16-bit: native (or unknown) bf16 keeps the depth-scaled preset; bf16 in software never drafts
    expected = VLLM_CPU_SOFTWARE_BF16_COSTS if native is False else vllm_cpu_costs(8)
    assert vllm_cpu_preset(8, 16, torch.bfloat16, native) == expected
    assert vllm_cpu_preset(8, 4, torch.float16, native) == expected


def test_float32_preset_charges_each_drafted_position():
    short, full = vllm_cpu_fp32_costs(4), vllm_cpu_fp32_costs(16)
    for batch in (1, 4, 16):
        assert short.draft_time(batch) < full.draft_time(batch)
    assert short.verify_time(5) == full.verify_time(5)
    # A drafter accepting ~70% of its drafts gets a few verified alone, none at 16 requests.
    assert 0 < max(plan(1, 0.7, full)) <= 8
    assert plan(16, 0.7, full) == [0] * 16
    # With several requests drafts must promise 1.3x plain (served batched steps cost more than
    # the preset): a ~70% drafter gets none verified at 4 requests, a ~95% one does.
    assert short.speedup_bar(1) < short.speedup_bar(4) == 1.3
    assert plan(4, 0.7, short) == [0] * 4
    assert min(plan(4, 0.95, short)) > 0
    for bad in (1, 0, 3.5, "16"):
        with pytest.raises(ValueError, match="draft_positions"):
            vllm_cpu_fp32_costs(bad)


def test_bf16_in_software_never_drafts():
    for batch in (1, 2, 8):
        assert plan(batch, 0.95, VLLM_CPU_SOFTWARE_BF16_COSTS) == [0] * batch


def test_the_vllm_adapter_picks_the_preset_for_the_targets_dtype(monkeypatch):
    import vllm_ext.drafting as drafting

    monkeypatch.delenv("DFLASH_COST_MODEL", raising=False)
    monkeypatch.setattr(drafting, "native_bf16", lambda: False)
    assert drafting.cost_model_from_env(True, 8, 16, torch.float32) == vllm_cpu_fp32_costs(16)
    assert drafting.cost_model_from_env(True, 8, 16, torch.bfloat16) == VLLM_CPU_SOFTWARE_BF16_COSTS
    assert drafting.costs_in_software_bf16(True, torch.bfloat16)
    assert not drafting.costs_in_software_bf16(True, torch.float32)
    assert not drafting.costs_in_software_bf16(False, torch.bfloat16)
    monkeypatch.setattr(drafting, "native_bf16", lambda: True)
    assert drafting.cost_model_from_env(True, 8, 16, torch.bfloat16) == vllm_cpu_costs(8)
    assert not drafting.costs_in_software_bf16(True, torch.bfloat16)
    assert drafting.cost_model_from_env(False, 8, 16, torch.float32) == cuda_costs(8)
    monkeypatch.setenv("DFLASH_COST_MODEL", "draft_fixed=0.5")
    assert drafting.cost_model_from_env(True, 8, 4, torch.float32) == replace(
        vllm_cpu_fp32_costs(4), draft_fixed=0.5)
