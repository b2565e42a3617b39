"""Stage 6 of training: the drafter in the published checkpoint format.

Training may use a reduced draft vocabulary (a frozen `lm_head` of target LM-head rows + `d2t`)
because the LM head dominates training cost. When those rows are exactly the target's, the
exported drafter drops them and borrows the target's full LM head instead: the published format
every engine loads (SGLang's DFlash worker only knows the target's head). Drafts then range over
the whole vocabulary; tokens outside the training vocabulary were never targets, so they rarely
win the argmax, and verification keeps the output lossless either way. The training vocabulary
itself is written beside the weights (dflash_plugin.draft_vocab), so that an adapter can still
draft over those rows only, which is cheaper.
"""

from __future__ import annotations

import copy

import torch

from dflash_plugin.checkpoint import save_drafter
from dflash_plugin.draft_vocab import write_draft_vocab
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


def export_drafter(drafter: DFlashDraftModel, target_lm_head: torch.Tensor | None, folder,
                   vocab: str = "full", dtype: torch.dtype = torch.bfloat16) -> DFlashDraftModel:
    """Write the drafter in the published format. vocab="full" (needs `target_lm_head`): a
    reduced draft vocabulary becomes the target's full head, and its ids go to
    draft_vocab.json; vocab="draft": the reduced head and `d2t` are kept in the weights."""
    if vocab not in ("full", "draft"):
        raise ValueError(f"export vocabulary {vocab!r}: expected full or draft")
    trained_ids = None
    if vocab == "full" and drafter.lm_head is not None:
        if target_lm_head is None:
            raise ValueError("a full-vocabulary export needs the target's LM head")
        trained_ids = drafter.to_target_ids(torch.arange(drafter.d2t.numel()))
        drafter = with_full_vocabulary(drafter, target_lm_head)
    save_drafter(drafter, folder, dtype=dtype)
    if trained_ids is not None:
        write_draft_vocab(folder, trained_ids)
    return drafter
