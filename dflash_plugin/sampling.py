"""Turning target logits into the distribution the target samples from: temperature, top-k,
top-p. Plain decoding and every speculative path go through `target_probs`, so they sample
from exactly the same distribution."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_plugin.errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k

    def __post_init__(self):
        if not (self.temperature >= 0.0):
            raise DFlashError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DFlashError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] after temperature, top-k and top-p (float32)."""
    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [..., V]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def choose_tokens(logits: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None) -> torch.Tensor:
    """The target's own choice at every row: argmax when greedy, else a sample."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample(target_probs(logits, params), generator)
