"""DFlash on the reference path with load-aware draft lengths: the vLLM plugin's policy
(draft_policy.DraftPolicy + rate_guard.RateGuard) applied to one request at a time.

Each round the drafter fills its whole block as usual; the policy then picks how many of its
drafts the target verifies (0 to block-1) from the drafts' top-1 probabilities, calibrated by
what verification has accepted so far, and from the step costs. Where the drafts are not
expected to pay for the draft pass (or, with a rate guard, where timed rounds show drafting
slower than plain decoding), the policy skips the draft pass: the round is a plain target
step, and the features of the skipped positions wait in `_pending_context` until the
next draft pass writes them to the drafter's cache (so its context is never stale).
Which drafts are verified never changes the emitted tokens: verification is the same as
SpecDecoder's, lossless at any length.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from dflash_plugin.draft_policy import (
    CPU_COSTS,
    CUDA_COSTS,
    CostModel,
    DraftPolicy,
    PolicyMode,
    top1_probability,
)
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.generate import GenerationResult, SpecDecoder
from dflash_plugin.rate_guard import RateGuard, WindowGuard
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.step_costs import StepCostFit


class AdaptiveSpecDecoder(SpecDecoder):
    """SpecDecoder whose verify length follows DraftPolicy; `num_verify_tokens` is the cap.

    One decoder keeps its policy across requests, so calibration and step timings carry over
    from prompt to prompt as they do inside a serving engine. rate_guard: True (a new guard),
    a RateGuard to share, or None (the default, as in the vLLM plugin); window_guard: a
    WindowGuard (A/B windows of drafting on and off) or None. fit_costs: re-fit the
    cost model from the timed rounds (step_costs.py), starting from `costs`. With neither, the
    preset cost model alone decides: reproducible verify lengths.
    """

    def __init__(self, target: nn.Module, drafter: DFlashDraftModel, block_size: int | None = None,
                 num_verify_tokens: int | None = None, costs: CostModel | None = None,
                 rate_guard: RateGuard | None | bool = None, fit_costs: bool = False,
                 window_guard: WindowGuard | None = None):
        super().__init__(target, drafter, block_size, num_verify_tokens)
        if costs is None:
            on_cpu = next(target.parameters()).device.type == "cpu"
            costs = CPU_COSTS if on_cpu else CUDA_COSTS
        guard = RateGuard() if rate_guard is True else (rate_guard or None)
        self.policy = DraftPolicy(PolicyMode.ADAPTIVE, costs, block=self.num_verify_tokens - 1,
                                  rate_guard=guard,
                                  cost_fit=StepCostFit(costs) if fit_costs else None,
                                  window_guard=window_guard)
        self._pending_context: torch.Tensor | None = None  # fused features not yet drafted on
        self._no_drafts = torch.zeros(0, dtype=torch.long)
        self.clock = time.perf_counter

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), seed: int = 0,
                 stop_token_ids: set[int] | frozenset = frozenset()) -> GenerationResult:
        self._pending_context = None  # a new request starts with an empty drafter cache
        try:
            return super().generate(input_ids, max_new_tokens, sampling, seed, stop_token_ids)
        finally:
            self._pending_context = None

    def speculate(self, bonus: int, start: int, context: torch.Tensor, caches: tuple,
                  block: int, sampling: SamplingParams, generator: torch.Generator):
        began = self.clock()
        if self._pending_context is not None:
            context = torch.cat([self._pending_context, context], dim=1)
            self._pending_context = None
        if self.policy.should_draft(1):
            verdict, features, drafted = self._draft_and_verify(
                bonus, start, context, caches, block, sampling, generator)
            ran_draft_pass = True
        else:
            self._pending_context = context
            verdict, features = self.verify_chain(bonus, self._no_drafts, start, caches[0],
                                                  sampling, generator)  # a plain step
            drafted, ran_draft_pass = 0, False
        if self.policy.times_steps:
            self.policy.record_step(1, 1 + drafted, verdict.accept_length, ran_draft_pass,
                                    self.clock() - began)
        return verdict, features, drafted

    def _draft_and_verify(self, bonus, start, context, caches, block, sampling, generator):
        target_cache, draft_cache = caches
        limit = min(block, self.num_verify_tokens) - 1
        logits = self.draft_logits(bonus, start, context, draft_cache, block, limit)
        confidence = top1_probability(logits)  # [limit]
        drafts = self.drafter.to_target_ids(logits.argmax(dim=-1))
        num_drafts = self.policy.choose(1, confidence[None], limit)[0]
        verdict, features = self.verify_chain(bonus, drafts[:num_drafts], start, target_cache,
                                              sampling, generator)
        if num_drafts:
            self.policy.observe([confidence[:num_drafts]], [len(verdict.accepted_tokens)])
        return verdict, features, num_drafts
