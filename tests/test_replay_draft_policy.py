"""tools/replay_draft_policy.py's replay on hand-made traces (no model): the step accounting
that its speedups rest on, and that it drives the real DraftPolicy."""

import importlib.util
from pathlib import Path

from dflash_plugin.draft_policy import DraftPolicy, PolicyMode, vllm_cpu_fp32_costs

_SPEC = importlib.util.spec_from_file_location(
    "replay_draft_policy", Path(__file__).parent.parent / "tools" / "replay_draft_policy.py")
replay_script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(replay_script)


def _trace(runs: list[int], drafts: int = 3, conf: float = 0.9) -> dict:
    """One prompt whose draft at each position is right for the first runs[i] tokens."""
    return {"conf": [[conf] * drafts for _ in runs],
            "match": [[int(k < run) for k in range(drafts)] for run in runs]}


def test_full_verification_counts_steps_tokens_and_time():
    # positions 0..9; runs: 3 at 0 (jump to 4), 0 at 4, 1 at 5 (jump to 7), 3 at 7 (to 11: end)
    runs = [3, 0, 0, 0, 0, 1, 0, 3, 0, 0]
    row = replay_script.replay([_trace(runs)], None, 3, draft_cost=0.5, verify_cost=0.1)
    # 4 steps, 4 + 3 + 1 + 3 = 11 tokens, each step 1 + 0.5 + 0.3
    assert row["tokens_per_step"] == 11 / 4
    assert row["speedup"] == round(11 / (4 * 1.8), 3)
    assert row["accepted_share"] == round(7 / 12, 3)


def test_oracle_is_plain_decoding_when_nothing_passes_and_beats_every_policy():
    nothing = [_trace([0] * 20)]
    assert replay_script.replay_oracle(nothing, 3, 0.5, 0.075)["speedup"] == 1.0
    mixed = [_trace([3, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0] * 4)]
    oracle = replay_script.replay_oracle(mixed, 3, 0.5, 0.075)["speedup"]
    full = replay_script.replay(mixed, None, 3, 0.5, 0.075)["speedup"]
    policy = DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(4), block=3)
    adaptive = replay_script.replay(mixed, policy, 3, 0.5, 0.075)["speedup"]
    assert oracle > full and oracle > adaptive


def test_policy_learns_to_stop_drafting_for_a_drafter_that_is_always_wrong():
    # Confident but never right: calibration must learn that and the policy stop drafting.
    wrong = [_trace([0] * 400, conf=0.95)]
    policy = DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(4), block=3)
    row = replay_script.replay(wrong, policy, 3, 0.5, 0.075)
    assert row["draft_pass_share"] < 0.5
    assert row["tokens_per_step"] == 1.0


def test_block_acceptance_walks_each_prompt_by_its_accepted_runs():
    # Prompt A, 6 positions: run 2 at 0 (to 3), run 0 at 3, run 1 at 4 (to 6): 3 steps.
    # Prompt B, 4 positions: run 3 at 0 (to 4): 1 step.
    a, b = _trace([2, 1, 0, 0, 1, 0]), _trace([3, 0, 0, 0])
    summary = replay_script.block_acceptance([a, b])
    assert summary["prompts"] == 2 and summary["drafts_per_step"] == 3
    assert summary["tau_per_prompt"] == round((6 / 3 + 4 / 1) / 2, 3)
    assert summary["tau_pooled"] == round(10 / 4, 3)
    # first draft right at positions with run >= 1: 3 of A's 6, 1 of B's 4
    assert summary["first_draft_accepted"] == round(4 / 10, 3)


def test_block_acceptance_skips_prompts_with_nothing_drafted():
    empty = {"conf": [], "match": []}
    summary = replay_script.block_acceptance([empty, _trace([0, 0])])
    assert summary["prompts"] == 1 and summary["tau_per_prompt"] == 1.0
