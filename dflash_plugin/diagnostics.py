"""Explaining why two decodings of the same prompt differ: where they first part, and how close
the target's two best tokens were there. In bfloat16, speculative and plain greedy decoding may
part at a near-tie, because verifying a block and decoding one token round differently."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (the shorter length when one is a
    prefix of the other), or None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class LogitGap:
    """The target's two best next tokens after a context, and their logits."""

    top_ids: tuple[int, int]
    top_logits: tuple[float, float]

    @property
    def gap(self) -> float:
        return self.top_logits[0] - self.top_logits[1]

    @property
    def relative_gap(self) -> float:
        """The gap as a fraction of the best logit's magnitude."""
        return self.gap / max(abs(self.top_logits[0]), 1e-9)


@torch.inference_mode()
def next_token_logits(target: nn.Module, prompt_ids: torch.Tensor | list[int],
                      prefix_tokens: list[int]) -> torch.Tensor:
    """The target's next-token logits [vocab] (computed in its own dtype, one uncached pass,
    returned as float32) after the prompt followed by `prefix_tokens`."""
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
    prefix = torch.tensor([list(prefix_tokens)], dtype=torch.long)
    return target(torch.cat([prompt, prefix], dim=1)).logits[0, -1].float()


def logit_gap_at(target: nn.Module, prompt_ids: torch.Tensor | list[int],
                 prefix_tokens: list[int]) -> LogitGap:
    """Top-2 next-token logits of the target (see next_token_logits) after the prompt followed
    by `prefix_tokens`."""
    top = torch.topk(next_token_logits(target, prompt_ids, prefix_tokens), 2)
    return LogitGap(tuple(top.indices.tolist()), tuple(top.values.tolist()))
