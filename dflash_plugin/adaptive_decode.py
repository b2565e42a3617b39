"""DFlash on the reference path with load-aware draft lengths: the vLLM plugin's policy
(draft_policy.DraftPolicy) applied to one request at a time.

Each round the drafter fills its whole block as usual; the policy then picks how many of its
drafts the target verifies (0 to block-1) from the drafts' top-1 probabilities, calibrated by
what verification has accepted so far, and from the step costs. Where the drafts are not
expected to pay for the draft pass, the policy skips the draft pass: the round is a plain target
step, and the features of the skipped positions wait in `_pending_context` until the
next draft pass writes them to the drafter's cache (so its context is never stale).
Which drafts are verified never changes the emitted tokens: verification is the same as
SpecDecoder's, lossless at any length.
"""

from __future__ import annotations

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
from dflash_plugin.sampling import SamplingParams


class AdaptiveSpecDecoder(SpecDecoder):
    """SpecDecoder whose verify length follows DraftPolicy; `num_verify_tokens` is the cap.

    One decoder keeps its policy across requests, so its calibration carries over from prompt
    to prompt as it does inside a serving engine. The cost model (`costs`, default the
    platform's preset) alone decides: reproducible verify lengths.
    """

    def __init__(self, target: nn.Module, drafter: DFlashDraftModel, block_size: int | None = None,
                 num_verify_tokens: int | None = None, costs: CostModel | None = None):
        super().__init__(target, drafter, block_size, num_verify_tokens)
        if costs is None:
            on_cpu = next(target.parameters()).device.type == "cpu"
            costs = CPU_COSTS if on_cpu else CUDA_COSTS
        self.policy = DraftPolicy(PolicyMode.ADAPTIVE, costs, block=self.num_verify_tokens - 1)
        self._pending_context: torch.Tensor | None = None  # fused features not yet drafted on
        self._no_drafts = torch.zeros(0, dtype=torch.long)

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
        if self._pending_context is not None:
            context = torch.cat([self._pending_context, context], dim=1)
            self._pending_context = None
        if self.policy.should_draft(1):
            return self._draft_and_verify(bonus, start, context, caches, block, sampling,
                                          generator)
        self._pending_context = context
        verdict, features = self.verify_chain(bonus, self._no_drafts, start, caches[0],
                                              sampling, generator)  # a plain step
        return verdict, features, 0

    def _draft_and_verify(self, bonus, start, context, caches, block, sampling, generator):
        target_cache, draft_cache = caches
        limit = min(block, self.num_verify_tokens) - 1
        logits = self.draft_logits(bonus, start, context, draft_cache, block, limit)
        confidence = top1_probability(logits)  # [limit]
        drafts = self.drafter.to_target_ids(logits.argmax(dim=-1))
        num_drafts = self.policy.choose(1, confidence[None], limit)[0]
        verdict, features = self.verify_chain(bonus, drafts[:num_drafts], start, target_cache,
                                              sampling, generator)
        self.policy.pass_outcome(1, num_drafts, len(verdict.accepted_tokens))
        if num_drafts:
            self.policy.observe([confidence[:num_drafts]], [len(verdict.accepted_tokens)])
        return verdict, features, num_drafts
