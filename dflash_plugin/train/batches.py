"""Turning a stored sequence into a training example: random anchors, each starting a block.

All layout rules (mask, positions, loss weights) come from `dflash_plugin.layout`, the same
module the inference loop uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_plugin.layout import (
    BlockwiseMask,
    loss_weights,
    training_attention_mask,
    training_block_positions,
    training_blockwise_mask,
)


@dataclass
class BlockBatch:
    block_ids: torch.Tensor  # [N*B] bonus token then masks, per block
    block_positions: torch.Tensor  # [N*B]
    labels: torch.Tensor  # [N*B] the token at each block position
    weights: torch.Tensor  # [N*B] loss weight; 0 for the bonus position and past the sequence
    blockwise_mask: BlockwiseMask  # the attention mask, factored (what the trainer uses)
    context_len: int
    num_blocks: int

    def to(self, device) -> "BlockBatch":
        """The same batch with its tensors on `device` (the layout is built on the CPU)."""
        mask = BlockwiseMask(self.blockwise_mask.context_visible.to(device),
                             self.blockwise_mask.block_size)
        return BlockBatch(self.block_ids.to(device), self.block_positions.to(device),
                          self.labels.to(device), self.weights.to(device), mask,
                          self.context_len, self.num_blocks)

    @property
    def attn_mask(self) -> torch.Tensor:
        """The same mask, dense [N*B, S + N*B] boolean (reference and tests)."""
        block_size = self.block_ids.numel() // self.num_blocks
        return training_attention_mask(self.block_positions[::block_size], self.context_len,
                                       block_size)


def sample_anchors(prompt_len: int, seq_len: int, num_anchors: int,
                   generator: torch.Generator) -> torch.Tensor:
    """Sorted anchors among response positions that have at least one token after them.

    An anchor is a token the target produced (at inference, the bonus token), so anchors start
    at the first response token.
    """
    candidates = torch.arange(prompt_len, seq_len - 1)
    if candidates.numel() == 0:
        raise ValueError(f"sequence of {seq_len} tokens has no response token to anchor on")
    pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
    return candidates[pick].sort().values


def make_block_batch(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                     mask_token_id: int, gamma: float) -> BlockBatch:
    seq_len = input_ids.numel()
    positions = training_block_positions(anchors, block_size)
    inside = positions < seq_len
    labels = input_ids[positions.clamp(max=seq_len - 1)]
    block_ids = torch.full_like(labels, mask_token_id)
    block_ids[::block_size] = input_ids[anchors]
    weights = loss_weights(block_size, gamma).repeat(anchors.numel()) * inside
    return BlockBatch(block_ids, positions, labels, weights,
                      training_blockwise_mask(anchors, seq_len, block_size), seq_len,
                      anchors.numel())


def draft_block_batch(drafter, embed, batch: BlockBatch, context: torch.Tensor) -> torch.Tensor:
    """The drafter's hidden states [N*B, H] for every block of `batch` in one pass: each block
    sees the fused target `context` [1, S, H] before its anchor and all of itself, as decoding
    would see it there."""
    context_positions = torch.arange(batch.context_len, device=context.device)[None]
    return drafter(embed(batch.block_ids)[None], context, batch.block_positions[None],
                   context_positions, attn_mask=batch.blockwise_mask)[0]


def leading_matches(correct: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per block, how many drafted positions (1..B-1) are right before the first miss:
    under teacher forcing on the target's own greedy output this is the accepted length - 1."""
    per_block = correct.view(-1, block_size)[:, 1:].int()
    return torch.cumprod(per_block, dim=1).sum(dim=1)
