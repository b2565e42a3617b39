"""Stage 6 of training: the drafter in the published checkpoint format.

Training may use a reduced draft vocabulary (a frozen `lm_head` of target LM-head rows + `d2t`)
because the LM head dominates training cost. When those rows are exactly the target's, the
exported drafter drops them and borrows the target's full LM head instead: the published format
every engine loads (SGLang's DFlash worker only knows the target's head). Drafts then range over
the whole vocabulary; tokens outside the training vocabulary were never targets, so they rarely
win the argmax, and verification keeps the output lossless either way.
"""

from __future__ import annotations

import copy

import torch

from dflash_plugin.drafter import DFlashDraftModel


def with_full_vocabulary(drafter: DFlashDraftModel, target_lm_head: torch.Tensor) -> DFlashDraftModel:
    """The same drafter reading the target's LM head; refuses a head that is not a copy of it."""
    if drafter.lm_head is None:
        return drafter
    target_ids = drafter.to_target_ids(torch.arange(drafter.d2t.numel()))
    copied = target_lm_head[target_ids].to(drafter.lm_head.weight.dtype)
    if not torch.equal(drafter.lm_head.weight.data, copied):
        raise ValueError("the drafter's lm_head is not a copy of the target's LM-head rows "
                         "(it was trained): keep the reduced vocabulary")
    config = copy.deepcopy(drafter.config)
    del config.draft_vocab_size
    full = DFlashDraftModel(config).to(drafter.lm_head.weight.dtype)
    state = {k: v for k, v in drafter.state_dict().items() if k not in ("lm_head.weight", "d2t")}
    full.load_state_dict(state, strict=True)
    return full


def reduced_head(target_lm_head: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft head over target ids `keep` (sorted): its weight rows and the `d2t` map
    (draft id + d2t[draft id] = target id, vLLM's format)."""
    return target_lm_head[keep], keep - torch.arange(keep.numel())


def with_reduced_vocabulary(drafter: DFlashDraftModel, target_lm_head: torch.Tensor,
                            keep: torch.Tensor) -> DFlashDraftModel:
    """The inverse of `with_full_vocabulary`: the same drafter reading only the target LM-head
    rows `keep` (sorted target ids), so that continuing training from an exported drafter
    keeps the cheap reduced head."""
    if drafter.lm_head is not None:
        raise ValueError("the drafter already has a reduced vocabulary")
    config = copy.deepcopy(drafter.config)
    config.draft_vocab_size = int(keep.numel())
    reduced = DFlashDraftModel(config).to(drafter.fc.weight.dtype)
    state = dict(drafter.state_dict())
    weight, state["d2t"] = reduced_head(target_lm_head, keep)
    state["lm_head.weight"] = weight.to(drafter.fc.weight.dtype)
    reduced.load_state_dict(state, strict=True)
    return reduced
