"""The drafter's training vocabulary, kept beside a full-vocabulary checkpoint.

A drafter trained with a reduced draft vocabulary is exported with the target's full LM head
(the format every engine loads), and the ids it was trained over go to `draft_vocab.json`.
An adapter that owns its logits computation can then multiply by only those LM-head rows: on a
CPU the draft pass's LM head over 15 positions is the costliest part of drafting (49K rows of
SmolLM2: ~11 ms on one core; its 16K training rows: ~4 ms). Drafts outside those ids were never
training targets, so they are rarely proposed anyway; verification keeps the output lossless
whichever head drafts.

The file is JSON, not safetensors, on purpose: engines load every `*.safetensors` file of a
drafter folder as weights.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import torch

from dflash_plugin.checkpoint import load_drafter
from dflash_plugin.defaults import default_drafter_path
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.errors import CheckpointError, MismatchError

DRAFT_VOCAB_FILE = "draft_vocab.json"


def write_draft_vocab(folder: str | Path, target_ids: torch.Tensor) -> Path:
    ids = sorted({int(i) for i in target_ids.tolist()})
    path = Path(folder) / DRAFT_VOCAB_FILE
    path.write_text(json.dumps({"num_ids": len(ids), "target_ids": ids}, separators=(",", ":")))
    return path


def read_draft_vocab(folder: str | Path, target_vocab_size: int) -> torch.Tensor | None:
    """Sorted target ids [N] (int64) of the folder's draft vocabulary, None if it has none."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        ids = torch.tensor(data["target_ids"], dtype=torch.long)
        declared = int(data["num_ids"])
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"{path} is not a draft vocabulary file ({err}); delete it to "
                              "draft over the full vocabulary") from err
    if ids.dim() != 1 or ids.numel() == 0 or ids.numel() != declared:
        raise CheckpointError(f"{path}: expected {declared} target ids in a flat list, got shape "
                              f"{tuple(ids.shape)}")
    if bool((ids[1:] <= ids[:-1]).any()):
        raise CheckpointError(f"{path}: target ids must be sorted and unique")
    if int(ids[0]) < 0 or int(ids[-1]) >= target_vocab_size:
        raise MismatchError(f"{path}: target ids run {int(ids[0])}..{int(ids[-1])}, outside the "
                            f"target's vocabulary of {target_vocab_size}")
    return ids


def draft_vocab_logits(hidden: torch.Tensor, head_rows: torch.Tensor,
                       matmul: Callable[[torch.Tensor], torch.Tensor] | None = None
                       ) -> torch.Tensor:
    """Logits [rows, draft vocabulary] from the draft vocabulary's LM-head rows only (float32:
    on CPU, argmax and softmax over bfloat16 rows are several times slower). `matmul`, if
    given, computes x @ head_rows.T (an engine's own kernel for those rows)."""
    hidden = hidden.to(head_rows.dtype)
    if matmul is None:
        return torch.nn.functional.linear(hidden, head_rows).float()
    return matmul(hidden).float()


def to_full_vocabulary(small: torch.Tensor, target_ids: torch.Tensor,
                       vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [rows, draft vocabulary] placed at their target ids in
    [rows, vocab_size]; every other token gets -inf, so argmax and sampling stay over target
    ids."""
    full = small.new_full((small.shape[0], vocab_size), float("-inf"))
    full[:, target_ids] = small
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


def restricted_to_draft_vocab(drafter: DFlashDraftModel, target_lm_head: torch.Tensor,
                              folder: str | Path) -> DFlashDraftModel:
    """The drafter loaded from `folder`, drafting over its training vocabulary if the folder
    keeps one (and it reads the target's head); otherwise the drafter unchanged."""
    if drafter.lm_head is not None:
        return drafter
    ids = read_draft_vocab(folder, drafter.config.vocab_size)
    if ids is None:
        return drafter
    return with_reduced_vocabulary(drafter, target_lm_head, ids).to(
        device=drafter.fc.weight.device).eval()


def load_drafter_for_target(target, folder: str | Path | None = None,
                            dtype: torch.dtype = torch.bfloat16,
                            draft_vocab: str = "auto") -> DFlashDraftModel:
    """The drafter in `folder` (default: the shipped one) ready to draft for `target`.

    draft_vocab "auto" drafts over the folder's training vocabulary when it keeps one (a cheaper
    draft LM head); "full" over the target's whole vocabulary.
    """
    if draft_vocab not in ("auto", "full"):
        raise ValueError(f"draft_vocab must be 'auto' or 'full', not {draft_vocab!r}")
    folder = folder or default_drafter_path()
    drafter = load_drafter(folder, dtype=dtype)
    if draft_vocab == "full":
        return drafter
    head = target.get_output_embeddings().weight.data.to(dtype)
    return restricted_to_draft_vocab(drafter, head, folder)
