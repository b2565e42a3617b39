"""The propose patch (P1) and the context writes it does for skipped draft passes.

P1 patches DFlashProposer.propose on the V1 runner (its target, guards and tests are in
docs/engine-ledger.md; the override is added on DFlashProposer only, so EAGLE and the other
proposers are untouched).

vLLM verifies every drafted token: the proposer returns a [batch, K] block, with one K per step
(num_speculative_tokens, or num_speculative_tokens_per_batch_size). Load-aware drafting needs a
length per request, including 0, and skipping the draft query pass when nobody would get drafts
verified.

It wraps the original, for drafters built by this plugin only (they carry a `dflash_drafting`
attribute; any other DFlash drafter runs the original untouched), and only with synchronous
scheduling (the CPU platform always uses it). It returns list[list[int]], as the ngram proposer
does: the V1 runner passes such lists to the scheduler as they are
(GPUModelRunner._get_draft_token_ids_cpu), and a shorter list schedules fewer tokens to verify.
Requests with min_p or logit_bias get none (vllm_ext.plain_sampling, P4/P5). With prompt lookup on
(DFLASH_NGRAM_DRAFTS, P6 in vllm_ext.ngram_drafts), a request may get its n-gram draft instead of
the drafter's, and a step whose lookup drafts are worth more than a draft pass skips it and stores
context as below. When no request is to get drafts, only the context K/V of the new target tokens
is stored (set_inputs_first_pass + build_model_inputs_first_pass), so later drafts never read
stale cache slots; by default that write is held back and done in one batched call before the next
draft pass (vllm_ext.context_store), which reads the proposer's context position and slot buffers
(checked at run time, written every step if they are missing). It also turns on the proposer's
`use_local_argmax_reduction` for these drafters, so greedy drafts come from the drafter's
`get_top_tokens` (vllm_ext.model): with a draft vocabulary no full-vocabulary logits are built
(skipped, with a log line, if the proposer has no such attribute or the config verifies adaptively
from logits).

Around every call it also times the step for the policy's measured costs: the interval since
the previous call returned is the target step, the time in the original propose the draft pass
(`Drafting.timing_step` / `timing_draft_pass`, dflash_plugin.step_clock).

It can go when vLLM lets a DFlash proposer return per-request draft lengths (for example by
extending `enable_adaptive_verification`, today DSpark-only, to DFlash).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vllm_ext.plain_sampling import plain_rows

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

PROPOSE_PARAMS = ("self", "num_speculative_tokens", "target_token_ids", "target_positions",
                  "target_hidden_states", "next_token_ids", "token_indices_to_sample",
                  "common_attn_metadata", "sampling_metadata", "mm_embed_inputs",
                  "num_rejected_tokens_gpu", "slot_mappings")
SET_INPUTS_PARAMS = ("self", "target_token_ids", "next_token_ids", "target_positions",
                     "target_hidden_states", "token_indices_to_sample", "cad",
                     "num_rejected_tokens_gpu")
BUILD_INPUTS_PARAMS = ("self", "num_tokens", "num_input_tokens", "mm_embed_inputs")
# A1: where set_inputs_first_pass leaves the context positions and slots (deferred writes read
# them)
CONTEXT_BUFFERS = ("_context_positions_buffer", "_context_slot_mapping_buffer")


# The proposer methods P1 overrides or calls, with the parameters it was written against.
EXPECTED_PARAMS = {"propose": PROPOSE_PARAMS, "set_inputs_first_pass": SET_INPUTS_PARAMS,
                   "build_model_inputs_first_pass": BUILD_INPUTS_PARAMS}


def _guard_failures(proposer_cls) -> list[str]:
    from vllm_ext.guards import hook_problems

    return hook_problems(proposer_cls, EXPECTED_PARAMS)


def install_propose_patch() -> bool:
    """Apply P1 once per process; True if it is (now or already) in place."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.guards import patch_method

    return patch_method(
        DFlashProposer, "propose", _load_aware_propose, EXPECTED_PARAMS,
        refused="load-aware drafting disabled, vLLM's full-block drafting is used instead",
        applied="load-aware drafting")


def _load_aware_propose(original):
    """P1's replacement for DFlashProposer.propose, around vLLM's `original`."""

    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None):
        args = (num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs,
                num_rejected_tokens_gpu, slot_mappings)
        drafting = _drafting_of(self)
        if drafting is None or self.vllm_config.scheduler_config.async_scheduling:
            return original(self, *args)
        plan, drafting.planned = drafting.planned, None
        if drafting.runner_timed:  # P8 times this step and may have planned it already
            if plan is not None:
                drafting.step_tokens = None  # P6 recorded the step again: already read
            return _propose_with_policy(original, self, drafting, args, plan)
        with drafting.timing_step(common_attn_metadata, target_hidden_states):
            return _propose_with_policy(original, self, drafting, args)

    return propose


@dataclass
class StepPlan:
    """What P1 decides before any drafting work: rows without drafts (P5) or without drafter
    context, whether the draft pass runs, this step's lookup matches, and the lengths of a
    lookup-only step (None: not one)."""

    batch: int
    no_drafts: list[int]
    no_context: list[int]
    draft_pass: bool
    matches: list
    lookup_only: list[int] | None

    @property
    def runs_draft_pass(self) -> bool:
        return self.draft_pass and self.lookup_only is None


def plan_step(drafting, num_speculative_tokens, target_token_ids, cad, sampling_metadata,
              num_rejected_tokens_gpu) -> StepPlan:
    """Learn from the verification this step reports, then plan the step (P1's first half;
    also run by P8 before vLLM prepares the drafter's inputs)."""
    batch = cad.batch_size()
    drafting.learn(target_token_ids[:cad.num_actual_tokens], cad.query_start_loc_cpu,
                   num_rejected_tokens_gpu)
    no_drafts = plain_rows(sampling_metadata)  # min_p / logit_bias requests (P5)
    no_context = drafting.rows_without_context(batch)  # P6's request ids
    draft_pass = (num_speculative_tokens > 0 and len({*no_drafts, *no_context}) < batch
                  and drafting.policy.should_draft(batch))
    matches = drafting.lookup(batch, num_speculative_tokens, no_drafts, draft_pass)  # P6's
    lookup_only = drafting.lookup_only(matches, num_speculative_tokens, draft_pass)
    return StepPlan(batch, no_drafts, no_context, draft_pass, matches, lookup_only)


def skip_draft_pass(proposer, drafting, plan: StepPlan, num_speculative_tokens,
                    next_token_ids) -> list[list[int]]:
    """A step without a draft pass: lookup drafts where the plan has them, none elsewhere."""
    drafting.skipped()
    proposer.num_speculative_tokens = num_speculative_tokens  # as the original does first
    proposer._last_draft_probs = None  # A2
    return drafting.lookup_drafts(plan.batch, plan.matches, plan.lookup_only, next_token_ids)


def _propose_with_policy(original, proposer, drafting, args, plan: StepPlan | None = None):
    """P1's body: the draft lengths the policy chooses for this step (see the module's doc)."""
    (num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
     next_token_ids, _, cad, sampling_metadata, _, num_rejected_tokens_gpu, _) = args
    if plan is None:
        plan = plan_step(drafting, num_speculative_tokens, target_token_ids, cad,
                         sampling_metadata, num_rejected_tokens_gpu)
    if not plan.runs_draft_pass:
        _store_context_only(proposer, drafting, target_token_ids, target_positions,
                            target_hidden_states, next_token_ids, cad,
                            num_rejected_tokens_gpu, plan.no_context)
        return skip_draft_pass(proposer, drafting, plan, num_speculative_tokens,
                               next_token_ids)
    if drafting.deferred_context is not None:
        drafting.flush_context(proposer.model)  # the draft pass reads that context
    _prefer_drafter_top_tokens(proposer)
    hints = drafting.hints if drafting.lookup_hints else None
    with drafting.collecting_confidence(), drafting.timing_draft_pass(), \
            _writing_hints(proposer, hints):
        drafts = original(proposer, *args)
    # Lookup drafts are verified as deterministic: not where this pass left draft
    # distributions for the rejection sampler (probabilistic draft sampling, A2).
    lookup = plan.matches if proposer._last_draft_probs is None else None
    return drafting.select(drafts, next_token_ids, plan.no_drafts, lookup, plan.no_context)


def context_writes_skipped(proposer, drafting, plan: StepPlan) -> bool:
    """Whether a step without a draft pass writes no drafter context at all: writes are
    deferred (A1's buffers present) and no row keeps context (`_store_context_only` then
    returns at once), so the step needs none of vLLM's drafter inputs."""
    return (drafting.deferred_context is not None and len(plan.no_context) == plan.batch
            and _has_context_buffers(proposer))


@contextmanager
def _writing_hints(proposer, matches):
    """For a drafter trained with prompt-lookup hints (dflash_plugin.lookup_hints): while the
    original propose runs, set_inputs_first_pass is followed by writing each request's lookup
    continuation into its mask slots of the query block (A6), which the draft pass embeds."""
    if not matches or all(m is None for m in matches):
        yield
        return
    method = type(proposer).set_inputs_first_pass

    def set_inputs_first_pass(*args, **kwargs):
        out = method(proposer, *args, **kwargs)
        write_hints(proposer.input_ids, matches, 1 + proposer.num_speculative_tokens)  # A6
        return out

    proposer.set_inputs_first_pass = set_inputs_first_pass  # this call only
    try:
        yield
    finally:
        del proposer.set_inputs_first_pass


def write_hints(input_ids: torch.Tensor, matches, per_request: int):
    """Write each match's tokens after its request's bonus token in the query blocks laid out
    `per_request` tokens per request (bonus, then masks), up to the block's end."""
    index, values = [], []
    for row, match in enumerate(matches):
        if match is None:
            continue
        tokens = match.tokens[:per_request - 1].tolist()
        start = row * per_request + 1
        index.extend(range(start, start + len(tokens)))
        values.extend(tokens)
    if index:
        input_ids[torch.tensor(index, device=input_ids.device)] = torch.tensor(
            values, dtype=input_ids.dtype, device=input_ids.device)


def _prefer_drafter_top_tokens(proposer):
    """Greedy drafts through the drafter's get_top_tokens (once per proposer)."""
    if getattr(proposer, "_dflash_top_tokens_checked", False):
        return
    proposer._dflash_top_tokens_checked = True
    spec = proposer.vllm_config.speculative_config
    if not hasattr(proposer, "use_local_argmax_reduction"):
        logger.warning("dflash plugin: this vLLM's proposer has no use_local_argmax_reduction; "
                       "greedy drafts go through full-vocabulary logits")
    elif getattr(spec, "enable_adaptive_verification", False) \
            or getattr(proposer, "use_heterogeneous_vocab", False):
        logger.info("dflash plugin: drafts through full-vocabulary logits (the speculative "
                    "config needs them)")
    elif hasattr(proposer.model, "get_top_tokens"):
        proposer.use_local_argmax_reduction = True


def _drafting_of(proposer):
    model = getattr(proposer, "model", None)
    unwrap = getattr(model, "unwrap", None)  # CUDA-graph wrappers
    if callable(unwrap):
        model = unwrap()
    return getattr(model, "dflash_drafting", None)


def _context_slots(proposer, target_token_ids) -> torch.Tensor:
    """This step's context slots, as set_inputs_first_pass left them (a view of a buffer the
    proposer reuses every step)."""
    return proposer._context_slot_mapping_buffer[:target_token_ids.shape[0]]  # A1


def _set_context_inputs(proposer, target_token_ids, target_positions, features,
                        next_token_ids, cad, num_rejected_tokens_gpu) -> int:
    """vLLM's own kernel: this step's context positions and cache slots (it also handles
    rejected drafts), and the query inputs; returns the number of query tokens."""
    num_tokens, _, _ = proposer.set_inputs_first_pass(
        target_token_ids=target_token_ids, next_token_ids=next_token_ids,
        target_positions=target_positions, target_hidden_states=features,
        token_indices_to_sample=None, cad=cad, num_rejected_tokens_gpu=num_rejected_tokens_gpu)
    return num_tokens


def _store_context_only(proposer, drafting, target_token_ids, target_positions,
                        target_hidden_states, next_token_ids, cad, num_rejected_tokens_gpu,
                        no_context=()):
    """What the original propose does before its query pass: project the new target features
    to draft context K/V and write them to the draft layers' cache. With deferred writes
    (`drafting.deferred_context`), only the positions and cache slots are computed now; the
    projection and the write wait in the queue (vllm_ext.context_store), without the tokens of
    the `no_context` rows (requests that never get the drafter's drafts)."""
    deferred = drafting.deferred_context
    if deferred is not None and not _has_context_buffers(proposer):
        drafting.flush_context(proposer.model)
        deferred = None
    if deferred is not None and len(no_context) == cad.batch_size():
        return  # nobody's context is kept: not even positions and slots are needed
    features = (target_hidden_states if deferred is not None
                else proposer.model.combine_hidden_states(target_hidden_states))
    num_tokens = _set_context_inputs(proposer, target_token_ids, target_positions, features,
                                     next_token_ids, cad, num_rejected_tokens_gpu)
    if deferred is None:
        proposer.build_model_inputs_first_pass(num_tokens, num_tokens, None)
        return
    num_context = target_token_ids.shape[0]
    # The proposer reuses these buffers every step: keep copies.
    positions = proposer._context_positions_buffer[:num_context].clone()  # A1
    slots = _context_slots(proposer, target_token_ids).clone()
    # vLLM concatenates the target layers' features into a new tensor each step; a view (a
    # target without auxiliary layers) could be overwritten before the flush, so copy it.
    if no_context:
        keep = _context_rows_kept(cad, num_context, no_context).to(positions.device)
        if not len(keep):
            return
        target_hidden_states, positions, slots = (target_hidden_states[keep], positions[keep],
                                                  slots[keep])  # copies
    kept = target_hidden_states if target_hidden_states._base is None \
        else target_hidden_states.clone()
    if deferred.add(kept, positions, slots):
        drafting.flush_context(proposer.model)


def _context_rows_kept(cad, num_context: int, no_context) -> torch.Tensor:
    """Indices of this step's context tokens outside the `no_context` requests' spans."""
    starts = cad.query_start_loc_cpu
    keep = torch.ones(num_context, dtype=torch.bool)
    for row in no_context:
        keep[int(starts[row]):int(starts[row + 1])] = False
    return keep.nonzero().squeeze(1)


def _has_context_buffers(proposer) -> bool:
    """A1's guard: the proposer attributes a deferred write reads (vLLM 0.32's DFlashProposer)."""
    ok = all(isinstance(getattr(proposer, name, None), torch.Tensor)
             for name in CONTEXT_BUFFERS)
    if not ok and not getattr(proposer, "_dflash_context_buffers_warned", False):
        proposer._dflash_context_buffers_warned = True
        logger.warning("dflash plugin: DFlashProposer has no %s; context K/V is written every "
                       "step, not deferred",
                       " / ".join(CONTEXT_BUFFERS))
    return ok
