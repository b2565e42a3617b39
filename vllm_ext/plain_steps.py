"""P8: a step that drafts nothing skips vLLM's preparation of the drafter's inputs.

Under load most steps draft nothing: the policy closes draft passes and, at such batch sizes,
no request keeps drafter context (vllm_ext.drafting.Drafting.rows_without_context). vLLM's
runner still prepares the drafter's inputs before P1's propose hook can say so: next tokens,
the target's auxiliary layers concatenated, positions (about 0.5 ms a step on a 2-core CPU,
docs/benchmarks.md). P8 plans the step (P1's first half, vllm_ext.patches.plan_step) before
that preparation, and where the step has no draft pass and writes no context it returns the
lookup drafts (or none) at once, exactly as P1's branch for such a step would. Every other
step goes on to vLLM's original with the plan handed to P1, which does not plan it again.

Only steps that verified no drafts take the short cut (vLLM 0.32 builds the speculative
metadata every step; such a step's has max_spec_len 0): their inputs to the plan are the
runner's own (input ids, the attention metadata, this step's single sampled token per row),
what P1 receives after the preparation on such a step, which changes none of them. P8 also
times every step for the step clock, around the preparation, in place of P1.

Ledger
------
P8  Target:  vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids (V1 runner)
    Why:     P1 runs after vLLM's preparation of the drafter's inputs, which a step without a
             draft pass or context writes does not need.
    How:     for this plugin's DFlash drafter, with synchronous scheduling and deferred context
             writes: plans the step; a step without a draft pass and without context writes
             returns P1's lookup drafts (or empty lists); anything else calls the original.
    Guard:   vLLM release series; the method's parameters (RUNNER_PROPOSE_PARAMS) and P1's
             guards; at run time the runner attributes it reads (input batch, input ids,
             discard mask), else the original runs.
"""

from __future__ import annotations

import torch

from vllm_ext.patches import (_drafting_of, context_writes_skipped, plan_step,
                              skip_draft_pass)

RUNNER_PROPOSE_PARAMS = ("self", "scheduler_output", "sampled_token_ids", "sampling_metadata",
                         "hidden_states", "sample_hidden_states", "aux_hidden_states",
                         "spec_decode_metadata", "common_attn_metadata", "slot_mappings")


def install_plain_steps() -> bool:
    """Apply P8 once per process; True if it is (now or already) in place."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_ext.guards import patch_method

    return patch_method(  # P8
        GPUModelRunner, "propose_draft_token_ids", _planning_first,
        {"propose_draft_token_ids": RUNNER_PROPOSE_PARAMS},
        refused="steps without drafts still prepare the drafter's inputs",
        applied="steps without drafts skip the drafter's input preparation")


def _drafting_for(runner):
    """This plugin's drafting state when P8 may act in this runner, else None."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, DFlashProposer) or getattr(runner, "use_async_scheduling", True):
        return None
    drafting = _drafting_of(drafter)
    if drafting is None or drafting.deferred_context is None:
        return None
    if not all(hasattr(runner, name) for name in ("input_batch", "input_ids",
                                                  "discard_request_mask")):
        return None
    return drafting


def _planning_first(original):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, slot_mappings):
        args = (scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                sample_hidden_states, aux_hidden_states, spec_decode_metadata,
                common_attn_metadata, slot_mappings)
        drafting = _drafting_for(self)
        if drafting is None:
            return original(self, *args)
        drafting.runner_timed = True
        try:
            with drafting.timing_step(common_attn_metadata, hidden_states):
                if _verified_drafts(spec_decode_metadata, sampled_token_ids):
                    return original(self, *args)  # P1 plans the step and learns from them
                return _plain_or_original(original, self, drafting, args)
        finally:
            drafting.runner_timed = False
            drafting.planned = None

    return propose_draft_token_ids


def _verified_drafts(spec_decode_metadata, sampled_token_ids) -> bool:
    """Whether this step verified drafts (or may have: then vLLM's preparation, which accounts
    for rejected ones, must run). With speculation configured the runner always builds the
    metadata; a step that verified none has max_spec_len 0 and one sampled token per row."""
    if spec_decode_metadata is not None and getattr(spec_decode_metadata, "max_spec_len", 1):
        return True
    return not (isinstance(sampled_token_ids, torch.Tensor) and sampled_token_ids.dim() == 2
                and sampled_token_ids.shape[1] == 1)


def _plain_or_original(original, runner, drafting, args):
    (scheduler_output, sampled_token_ids, sampling_metadata, _, _, _, _, cad, _) = args
    num_spec = scheduler_output.num_spec_tokens_to_schedule
    # What P6 records in the preparation this step may skip (vllm_ext.ngram_drafts).
    drafting.step_tokens = (runner.input_batch, sampled_token_ids,
                            runner.discard_request_mask.gpu)
    target_token_ids = runner.input_ids.gpu[:scheduler_output.total_num_scheduled_tokens]
    plan = plan_step(drafting, num_spec, target_token_ids, cad, sampling_metadata, None)
    proposer = runner.drafter
    if plan.runs_draft_pass or not context_writes_skipped(proposer, drafting, plan):
        drafting.planned = plan
        return original(runner, *args)
    # No drafts were verified: each row sampled one token, the next one to draft from (a
    # discarded row's is never read: it has no lookup match).
    drafting.counts.plain_steps += 1
    return skip_draft_pass(proposer, drafting, plan, num_spec, sampled_token_ids[:, 0])
