"""The DFlash block layout: the one place that defines which target layers feed the drafter,
how a block is laid out, and which keys each block query may see.

Inference (`generate.py`), training (`train/trainer.py`) and the engine adapters all import these
rules, so the drafter is trained on exactly the layout it is later asked to fill in (SpecForge
once trained with shifted labels and got near-zero acceptance: the rule must live once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Layer id N names the *output* of decoder layer N. Hugging Face's `hidden_states` tuple starts
# with the embeddings, so that output sits at index N + 1 (vLLM's aux-layer ids use N + 1 too).
HIDDEN_STATES_OFFSET = 1


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers spread uniformly from layer 1 to layer L-3 (the paper's rule)."""
    if num_target_layers < 4:
        raise ValueError(f"a DFlash target needs at least 4 layers, got {num_target_layers}")
    if num_draft_layers < 1:
        raise ValueError(f"num_draft_layers must be >= 1, got {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def block_input_ids(bonus_token: int, mask_token_id: int, block_size: int) -> list[int]:
    """A block is the target's last chosen token followed by B-1 mask tokens."""
    return [bonus_token] + [mask_token_id] * (block_size - 1)


def block_positions(start: int, block_size: int, device=None) -> torch.Tensor:
    """Absolute positions of a block whose bonus token sits at `start`."""
    return torch.arange(start, start + block_size, device=device)


# Output position k of a block predicts the token *at* position k (no shift); position 0 is the
# bonus token the target already chose, so one draft yields B-1 proposals.
FIRST_DRAFTED_POSITION = 1


def loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Per-position loss weight exp(-(k-1)/gamma) for k = 1..B-1; the bonus position gets 0.

    Early positions matter more: a draft is only accepted up to its first wrong token.
    """
    k = torch.arange(block_size, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


def default_gamma(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8; in between, interpolate."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    if block_size in table:
        return table[block_size]
    return max(1.0, 7.0 * math.log(block_size) / math.log(16))


def _block_of_query(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    return torch.arange(anchors.numel() * block_size, device=anchors.device) // block_size


def _context_visible(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[N*B, S]: a query in block j may see context key k iff k < anchors[j]."""
    keys = torch.arange(context_len, device=anchors.device)
    return keys[None, :] < anchors[_block_of_query(anchors, block_size)][:, None]


def training_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int,
                            valid: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask [N*B, S + N*B] for N blocks anchored at `anchors` over a context of S tokens.

    A query in block j may see context key k iff k < anchors[j] (at inference the anchor's own
    features do not exist yet), and every key of its own block (bidirectional); nothing of other
    blocks. Blocks marked invalid (padding) see nothing.
    """
    block_of_query = _block_of_query(anchors, block_size)
    same_block = block_of_query[:, None] == block_of_query[None, :]
    mask = torch.cat([_context_visible(anchors, context_len, block_size), same_block], dim=1)
    if valid is not None:
        mask &= valid[block_of_query][:, None]
    return mask


def training_block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Positions [N*B] of the blocks: block j covers anchors[j] .. anchors[j]+B-1."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, None] + offsets[None, :]).reshape(-1)


@dataclass(frozen=True)
class BlockwiseMask:
    """The training mask of `training_attention_mask` in factored form, for attention that
    never scores the (all-masked) pairs of different blocks: a query in block j sees context
    keys where `context_visible` is True and every key of its own block. Exact, and about
    4x cheaper than the dense [N*B, S + N*B] mask when N*B >> S / N."""

    context_visible: torch.Tensor  # [N*B, S] boolean
    block_size: int


def training_blockwise_mask(anchors: torch.Tensor, context_len: int,
                            block_size: int) -> BlockwiseMask:
    return BlockwiseMask(_context_visible(anchors, context_len, block_size), block_size)
