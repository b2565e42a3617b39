"""P8 (vllm_ext.plain_steps), engine-free: a step that verified nothing and will neither draft
nor write drafter context skips vLLM's drafter-input preparation and returns what P1 would
have; every other step reaches vLLM's original, planned once. The engine test is in
test_ngram_engine.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_context_free import BLOCK, PROMPT, drafting

pytest.importorskip("vllm", reason="needs the vLLM CPU build")


def test_guard_passes_on_the_installed_vllm_and_refuses_a_changed_signature():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_ext.guards import hook_problems
    from vllm_ext.plain_steps import RUNNER_PROPOSE_PARAMS

    expected = {"propose_draft_token_ids": RUNNER_PROPOSE_PARAMS}
    assert hook_problems(GPUModelRunner, expected) == []

    class Changed:
        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids):
            pass

    assert "parameters" in hook_problems(Changed, expected)[0]


def runner_with(d, rows):
    """A runner whose DFlash proposer carries `d`, one decoding step of len(rows) requests
    (each sampled token 8 after its row)."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    proposer = object.__new__(DFlashProposer)
    proposer.model = SimpleNamespace(dflash_drafting=d)
    proposer._context_positions_buffer = torch.zeros(64, dtype=torch.long)  # A1's buffers
    proposer._context_slot_mapping_buffer = torch.zeros(64, dtype=torch.long)
    token_ids = np.zeros((len(rows), max(32, *map(len, rows))), dtype=np.int32)
    for i, row in enumerate(rows):
        token_ids[i, :len(row)] = row
    batch = SimpleNamespace(req_ids=[f"r{i}" for i in range(len(rows))],
                            token_ids_cpu=token_ids, vocab_size=100,
                            num_tokens_no_spec=np.array([len(r) for r in rows]))
    return SimpleNamespace(drafter=proposer, use_async_scheduling=False, input_batch=batch,
                           input_ids=SimpleNamespace(gpu=torch.full((64,), 8)),
                           discard_request_mask=SimpleNamespace(
                               gpu=torch.zeros(len(rows), dtype=torch.bool)))


def call(runner, verified=0):
    """P8's replacement around an `original` that records what it was given."""
    from vllm_ext.plain_steps import _planning_first

    seen = []

    def original(runner, *args):
        drafting = runner.drafter.model.dflash_drafting
        seen.append((drafting.planned, drafting.runner_timed))
        return "original"

    batch = len(runner.input_batch.req_ids)
    cad = SimpleNamespace(batch_size=lambda: batch, num_actual_tokens=batch,
                          query_start_loc_cpu=torch.arange(batch + 1, dtype=torch.int32))
    scheduler_output = SimpleNamespace(num_spec_tokens_to_schedule=BLOCK,
                                       total_num_scheduled_tokens=batch)
    sampling = SimpleNamespace(logitsprocs=SimpleNamespace(argmax_invariant=[]))
    # vLLM builds the speculative metadata on every step; max_spec_len 0: nothing verified
    metadata = SimpleNamespace(max_spec_len=verified)
    sampled = torch.full((batch, 1 + verified), 8, dtype=torch.int32)
    out = _planning_first(original)(runner, scheduler_output, sampled, sampling, None, None,
                                    None, metadata, cad, None)
    return out, seen


def test_a_step_without_pass_or_context_returns_lookup_drafts_without_the_original():
    d = drafting(lookup=True)
    d.policy.should_draft = lambda batch: False
    d.policy.passes_hopeless = lambda batch: True  # nobody keeps drafter context
    runner = runner_with(d, [PROMPT + [7], [40, 41]])
    out, seen = call(runner)
    assert seen == []  # vLLM's preparation and P1 never ran
    # row 0's history ends ... 7, 8: PROMPT's 7, 8 continue with 9, 10, ...
    assert out[0] and out[0] == PROMPT[PROMPT.index(8) + 1:][:len(out[0])]
    assert out[1] == []
    assert d.counts.plain_steps == 1 and d.counts.steps == 1
    assert d.planned is None and not d.runner_timed
    assert (8, *out[0]) in d._pending  # learnt from when verification reports back


def test_a_step_that_drafts_or_keeps_context_goes_to_the_original_planned_once():
    d = drafting(lookup=True)
    d.policy.should_draft = lambda batch: True
    runner = runner_with(d, [[5, 6], [40, 41]])
    out, seen = call(runner)
    assert out == "original"
    plan, timed = seen[0]
    assert timed and plan is not None and plan.runs_draft_pass and plan.batch == 2
    assert d.counts.steps == 1 and d.counts.plain_steps == 0  # learnt once, by P8
    assert d.planned is None and not d.runner_timed
    # no draft pass, but the requests keep drafter context: vLLM's inputs are needed
    d.policy.should_draft = lambda batch: False
    out, seen = call(runner_with(d, [[5, 6], [40, 41]]))
    assert out == "original" and not seen[0][0].runs_draft_pass
    assert d.counts.plain_steps == 0


def test_a_step_that_verified_drafts_leaves_planning_to_p1():
    d = drafting(lookup=True)
    d.policy.passes_hopeless = lambda batch: True
    out, seen = call(runner_with(d, [[5, 6], [40, 41]]), verified=2)
    assert out == "original" and seen == [(None, True)]
    assert d.counts.steps == 0  # P1 learns from the verification, not P8
