"""Anchors drawn where greedy decoding starts its blocks (not in the paper, which draws them
uniformly over the answer).

Decoding starts a block only at the token after the previous block's last accepted draft, that
is at a token the drafter got wrong, so decoding's tau is set by the hard positions that uniform
anchors under-weight; a position whose token the first draft from the position before got wrong
almost always starts a block (teacher-forced traces of `tools/replay_draft_policy.py`;
docs/history.md, section 1, "Anchors where decoding starts blocks").

`block_start_weights` turns that into sampling weights from one cheap no-grad pass that drafts
a single token after every answer position (blocks of two: the bonus token and one mask), and
`sample_weighted_anchors` draws anchors with them.
"""

from __future__ import annotations

import torch

from dflash_plugin.train.batches import draft_block_batch, make_block_batch

# P(decoding starts a block at t | the first draft from t-1 equals the token at t), from those
# traces; a wrong first draft gives nearly 1, taken as 1.
START_RATE_AFTER_RIGHT_DRAFT = 0.17


@torch.no_grad()
def first_drafts(drafter, embed, target_head, input_ids: torch.Tensor, context: torch.Tensor,
                 prompt_len: int) -> torch.Tensor:
    """[seq_len - 1 - prompt_len] target token ids: for each answer position a but the last,
    the drafter's draft for a + 1, from a block [token a, mask] that sees the target's context
    before a, as decoding would.

    A two-position block is not the full block (there the mask also attends to the other
    masks), so this estimates the full block's first draft at an eighth of its cost."""
    anchors = torch.arange(prompt_len, input_ids.numel() - 1)
    batch = make_block_batch(input_ids, anchors, 2, drafter.mask_token_id, gamma=1.0)
    hidden = draft_block_batch(drafter, embed, batch, context)
    return drafter.to_target_ids(drafter.draft_logits(hidden[1::2], target_head).argmax(-1))


def first_draft_hits(drafter, embed, target_head, input_ids: torch.Tensor, context: torch.Tensor,
                     prompt_len: int) -> torch.Tensor:
    """Whether each of `first_drafts` equals the answer's next token."""
    drafts = first_drafts(drafter, embed, target_head, input_ids, context, prompt_len)
    return drafts == input_ids[prompt_len + 1:]


def block_start_weights(hits: torch.Tensor,
                        rate_after_right_draft: float = START_RATE_AFTER_RIGHT_DRAFT
                        ) -> torch.Tensor:
    """Sampling weight per answer position but the last (the anchor candidates): the first
    answer token always starts a block; a later one with probability ~1 when the first draft
    of its token was wrong, `rate_after_right_draft` when it was right."""
    after_right = torch.cat([torch.zeros(1, dtype=torch.bool), hits[:-1]])
    return torch.where(after_right, rate_after_right_draft, 1.0)


def sample_weighted_anchors(prompt_len: int, weights: torch.Tensor, num_anchors: int,
                            generator: torch.Generator) -> torch.Tensor:
    """Sorted anchors, drawn without replacement with `weights` over positions prompt_len...
    (all positions when fewer than num_anchors)."""
    count = min(num_anchors, weights.numel())
    pick = torch.multinomial(weights, count, replacement=False, generator=generator)
    return (prompt_len + pick).sort().values
