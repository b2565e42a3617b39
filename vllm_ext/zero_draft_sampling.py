"""P2: a short cut through vLLM's rejection sampler for steps that verify no drafts (the patch
on RejectionSampler.forward; its target, guards and tests are in docs/engine-ledger.md).

With load-aware drafting most steps under load verify no drafts at all, yet a speculative engine
sends every step through the rejection sampler, which copies and upcasts the logits and runs its
kernels on empty inputs only to return the bonus tokens the plain sampler drew. When the step
verifies no drafts (metadata.max_spec_len == 0), no logprobs are asked for and synthetic
acceptance (a benchmarking mode) is off, P2 returns the plain sampler's tokens for the bonus rows
directly: the same call on the same logits that the original makes first, so the tokens are
identical at T=0 and seeded requests draw the same tokens (rejection_sample leaves their
generators alone when they have no drafts); the original's only other draw, on the unseeded
global stream, is skipped. Any other step runs the original unchanged. It is installed only in a
worker that builds this plugin's drafter, next to P1; DFLASH_SAMPLER_SHORTCUT=off keeps it out.
It can go when vLLM's runner skips the rejection sampler for steps without drafts.
"""

from __future__ import annotations

from vllm_ext.guards import hook_problems, patch_method

FORWARD_PARAMS = ("self", "metadata", "draft_probs", "logits", "sampling_metadata")


class ShortCutCounter:
    """Steps that took the short cut, per process (read by tests through a worker RPC)."""

    steps = 0


def verifies_nothing(sampler, metadata, sampling_metadata) -> bool:
    """Whether this rejection-sampler call can be answered by the plain sampler alone."""
    return (getattr(metadata, "max_spec_len", None) == 0
            and sampling_metadata.max_num_logprobs is None
            and not sampling_metadata.logprob_token_ids
            and not getattr(sampler, "synthetic_mode", False))


def guard_problems(sampler_cls) -> list[str]:
    return hook_problems(sampler_cls, {"forward": FORWARD_PARAMS})  # P2's guard


def install_zero_draft_sampling() -> bool:
    """Apply P2 once per process; True if it is (now or already) in place."""
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    def make_forward(original):
        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            if not verifies_nothing(self, metadata, sampling_metadata):
                return original(self, metadata, draft_probs, logits, sampling_metadata)
            ShortCutCounter.steps += 1
            rows = metadata.bonus_logits_indices
            # Without drafts each request has one logits row, in order: the plain sampler reads
            # them in place, as plain decoding does, instead of a copy (B x vocab per step).
            bonus = self.sampler(logits=logits if rows.numel() == logits.shape[0] else logits[rows],
                                 sampling_metadata=sampling_metadata, predict_bonus_token=True)
            return SamplerOutput(sampled_token_ids=bonus.sampled_token_ids,
                                 logprobs_tensors=None)
        return forward

    return patch_method(  # P2
        RejectionSampler, "forward", make_forward, {"forward": FORWARD_PARAMS},
        refused="steps without drafts go through vLLM's full rejection sampler",
        applied="steps without drafts skip the rejection kernels")
