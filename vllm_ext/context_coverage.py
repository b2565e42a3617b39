"""Which requests still have their whole drafter context, when steps under heavy load skip it.

DFlash keeps, for every token the target has processed, the drafter's context K/V (the fused
target features projected by each draft layer) in the draft layers' paged cache. That write
costs ~2.5% of the target's compute per token (for SmolLM2: the 2880 -> 576 `fc` and 8 layers'
K/V projections against the target's 30 layers and LM head), and it is paid by every token,
drafted or not: at a batch size where no draft can pay off it is the speculative mode's largest
remaining price. With coverage tracking, decoding steps at such a batch size
(`DraftPolicy.drafts_possible` is False) skip the write; the requests they served then have a
gap in their context and are never drafted again (their drafts would attend to whatever the
skipped slots last held), which loses nothing while the load lasts. Requests that arrive when the
load allows drafting get their whole context written as before.

Prompt tokens always get their context (vllm_ext.drafting.Drafting.stores_context), because
vLLM's prefix cache serves a prompt's blocks to later requests: a gap in a shared system prompt
would keep every request that reuses it from being drafted. Generated tokens are another
matter: the next turn of a conversation answered under heavy load reuses that answer's cached
blocks, gaps included, so it is decoded without drafts (as fast as plain decoding, not faster).

`ContextCoverage` keeps one flag per cache slot: does the slot hold the context K/V of the token
that was last processed into it? Every context write sets its slots, every skipped step clears
its slots, and a request may be drafted only if every position of its context so far maps
(through its block table) to a set slot. A slot never written counts as unset, a slot reused by
a new request is set or cleared by that request's own step before any draft could read it, and a
prefix-cache hit reuses the slots of the same tokens at the same positions, so their flags stay
true. Flags are set when a write is queued (vllm_ext.context_store flushes its queue before any
draft pass reads it).

Opt-in: DFLASH_CONTEXT_GAPS = off (default: every step's context is written, as vLLM does) | on,
read by vllm_ext.drafting.context_gaps_from_env. On the 2-core AVX2 EPYC (float32, batch 32, 54
held-out prompts, offline) it took the plugin's share of the worker's time from 2.6% to 1.3%
(py-spy), but end to end neither offline nor served runs (3 each, 16 and 32 concurrent requests)
showed a difference beyond their 3-5% run-to-run spread, so the drafting it forgoes after a
load peak is not yet paid for by a measured gain.
"""

from __future__ import annotations

import torch


class ContextCoverage:
    """Per-slot flags of one drafter's paged cache: context K/V written for the slot's token."""

    def __init__(self):
        self._written = torch.zeros(0, dtype=torch.bool)
        self.skipped_tokens = 0  # tokens whose context a step left out (diagnostics and tests)

    def record(self, slots: torch.Tensor, written: bool):
        """One step's context slots [T]: written (or queued), or skipped. Negative slots are
        padding and name no cache entry."""
        slots = slots[slots >= 0]
        if not slots.numel():
            return
        self._grow(slots)
        self._written[slots] = written
        if not written:
            self.skipped_tokens += slots.numel()

    def rows_complete(self, block_table: torch.Tensor, context_lens: torch.Tensor,
                      block_size: int) -> list[bool]:
        """For each row of `block_table` [B, blocks]: are the slots of positions
        0 .. context_lens[i] - 1 all written?"""
        batch = block_table.shape[0]
        longest = int(context_lens.max()) if batch else 0
        if longest <= 0:
            return [True] * batch
        device = block_table.device
        positions = torch.arange(longest, device=device)
        blocks = block_table[:, positions // block_size].to(torch.int64)
        slots = blocks * block_size + positions % block_size  # [B, longest]
        in_context = positions[None, :] < context_lens.to(device)[:, None]
        self._to(device)
        known = slots < self._written.numel()
        written = torch.zeros_like(in_context)
        written[known] = self._written[slots[known]]
        return (written | ~in_context).all(dim=1).tolist()

    def _grow(self, slots: torch.Tensor):
        self._to(slots.device)
        needed = int(slots.max()) + 1
        if needed > self._written.numel():
            grown = torch.zeros(max(needed, 2 * self._written.numel()), dtype=torch.bool,
                                device=slots.device)
            grown[:self._written.numel()] = self._written
            self._written = grown

    def _to(self, device: torch.device):
        if self._written.device != device:
            self._written = self._written.to(device)
