"""Give a trained drafter more target layers to read, without changing what it drafts.

The drafter fuses the target's selected layer outputs with one linear map, `fc`, whose input is
their concatenation. A drafter trained on some layers can take more: the kept layers' columns
of `fc` are copied to their new places and the added layers' columns start at zero, so the
wider drafter drafts exactly what the narrower one did, and training gives the added layers
weight only where that lowers the loss (as `deepen.py` does for depth).
"""

from __future__ import annotations

import copy

import torch

from dflash_plugin.drafter import DFlashDraftModel


def widen_drafter(drafter: DFlashDraftModel, layer_ids: list[int]) -> DFlashDraftModel:
    """The same drafter reading the target layers `layer_ids` (which must include its own)."""
    have, layer_ids = list(drafter.fields.target_layer_ids), list(layer_ids)
    missing = [layer for layer in have if layer not in layer_ids]
    if missing:
        raise ValueError(f"cannot drop target layers {missing} from a drafter that reads {have}; "
                         f"asked for {layer_ids}")
    if layer_ids == have:
        return drafter
    config = copy.deepcopy(drafter.config)
    config.dflash_config = {**config.dflash_config, "target_layer_ids": layer_ids}
    weight = drafter.fc.weight
    wider = DFlashDraftModel(config).to(dtype=weight.dtype, device=weight.device)
    state = drafter.state_dict()
    hidden = drafter.fields.target_hidden_size
    fc = weight.data.new_zeros(weight.shape[0], len(layer_ids) * hidden)
    for old_slot, layer in enumerate(have):
        new_slot = layer_ids.index(layer)
        fc[:, new_slot * hidden:(new_slot + 1) * hidden] = \
            weight.data[:, old_slot * hidden:(old_slot + 1) * hidden]
    state["fc.weight"] = fc
    wider.load_state_dict(state, strict=True)
    return wider.train(drafter.training)
