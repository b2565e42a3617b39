"""Deferred context K/V writes for steps where the drafter does not draft.

DFlash keeps, for every token the target has processed, the drafter's context K/V (the fused
target features projected by each draft layer) in the draft layers' paged cache, so that a later
draft pass can attend to it. When the policy skips the draft pass, that write is the drafter's
only work in the step, and on a CPU it is a dozen small operations per step whose cost is
mostly per call. `DeferredContext` holds those writes back (the raw target features, and the
positions and cache slots vLLM computed for them) and does them in one batched call:

- before the next draft pass, so a draft never reads a slot that is not written yet;
- when the held tokens reach `max_tokens`, which bounds the memory held (5 target layers x
  hidden x 2 bytes per token: ~5.6 KiB for SmolLM2, ~40 KiB for an 8B target).

Writes keep their order: every context write of a drafter built by this plugin goes through
this queue, and a draft pass flushes it first. A slot freed by a finished request and given to a
new one is therefore rewritten after, never before, the old request's pending write to it.

Environment: DFLASH_DEFER_CONTEXT = on (default) | off (write every step, as vLLM does),
read by vllm_ext.drafting.defer_context_from_env.
"""

from __future__ import annotations

import torch

DEFAULT_MAX_TOKENS = 2048


class DeferredContext:
    """Pending context writes of one drafter: target features [T, F], positions [T], slots [T]."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._states: list[torch.Tensor] = []
        self._positions: list[torch.Tensor] = []
        self._slots: list[torch.Tensor] = []
        self.num_tokens = 0
        self.flushes = 0  # batched writes done (diagnostics and tests)

    def add(self, states: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        """Hold one step's writes; True when the queue is full and should be flushed now.

        The tensors must not be overwritten later by the engine: `states` is the concatenation
        vLLM builds each step, and callers pass copies of positions and slots taken from the
        proposer's reused buffers.
        """
        if not (states.shape[0] == positions.shape[0] == slots.shape[0]):
            raise ValueError(f"context rows disagree: states {tuple(states.shape)}, positions "
                             f"{tuple(positions.shape)}, slots {tuple(slots.shape)}")
        if states.shape[0]:
            self._states.append(states)
            self._positions.append(positions)
            self._slots.append(slots)
            self.num_tokens += states.shape[0]
        return self.num_tokens >= self.max_tokens

    def flush(self, drafter) -> int:
        """Write everything held, in order, through the drafter's own context path; returns the
        number of tokens written."""
        if not self.num_tokens:
            return 0
        states, positions, slots = (torch.cat(parts) if len(parts) > 1 else parts[0]
                                    for parts in (self._states, self._positions, self._slots))
        written = self.num_tokens
        self.clear()
        context = drafter.combine_hidden_states(states)
        drafter.precompute_and_store_context_kv(context, positions, slots)
        self.flushes += 1
        return written

    def clear(self):
        self._states, self._positions, self._slots = [], [], []
        self.num_tokens = 0
