"""Prompt-lookup hints in the drafter's block: the mask slots after the bonus token carry the
n-gram lookup's continuation of the history, where it finds one, instead of mask tokens.

Why: on the target's answers to real user prompts the drafter seldom continues a span that the
answer copies from the prompt or from itself, which lookup finds; the per-position better of the
two accepts 3.7 teacher-forced against 1.9 for the drafter alone (docs/history.md). A drafter
trained with hints (`dflash_config.lookup_hints`) reads the lookup's guess and keeps or corrects
it token by token, in one linear draft that any chain-verifying runner checks. A drafter trained
without them is confused by them (1.57), so they are used only where its config says so; the
shipped drafter has none (a first one gained on its own chain, not beside the lookup's draft:
docs/history.md, round 21). Lossless either way: hints only change what is drafted.
"""

from __future__ import annotations

import numpy as np
import torch

from dflash_plugin.config import dflash_fields
from dflash_plugin.ngram import lookup_continuation


def uses_lookup_hints(drafter) -> bool:
    return bool(drafter.fields.lookup_hints)


def hinted_block(bonus: int, mask_token_id: int, block_size: int, history) -> list[int]:
    """A block for a drafter trained with hints: the bonus token (the history's last token),
    the lookup's continuation of the history, and mask tokens past its end."""
    hint = lookup_continuation(history, block_size - 1)
    return [bonus] + hint + [mask_token_id] * (block_size - 1 - len(hint))


def fill_batch_hints(block_ids: torch.Tensor, input_ids, anchors: torch.Tensor, block_size: int,
                     keep: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Training blocks (bonus then masks, one per anchor) with each block's hint written in,
    from the history up to and including its anchor. `keep` < 1 leaves that share of the
    blocks that have a hint all masks, so the drafter keeps drafting from masks alone (as an
    engine that writes no hints asks it to)."""
    out = block_ids.clone()
    tokens = np.asarray(input_ids)
    draws = torch.rand(anchors.numel(), generator=generator) if keep < 1.0 else None
    for b, anchor in enumerate(anchors.tolist()):
        if draws is not None and draws[b] >= keep:
            continue
        hint = lookup_continuation(tokens[:anchor + 1], block_size - 1)
        if hint:
            start = b * block_size + 1
            out[start:start + len(hint)] = torch.as_tensor(hint, dtype=out.dtype)
    return out


def enable_lookup_hints(drafter) -> None:
    """Mark a drafter (and the checkpoints saved from it) as reading hints."""
    drafter.config.dflash_config = {**drafter.config.dflash_config, "lookup_hints": True}
    drafter.fields = dflash_fields(drafter.config)
