"""Grow a trained drafter by appending layers that start as the identity.

A deeper drafter need not start from scratch: each new layer is a copy of the last trained one
with its two output projections (attention `o_proj`, MLP `down_proj`) zeroed, so its residual
branches add nothing and the deeper drafter drafts exactly what the shallower one did. Training
then moves the new layers away from the identity only where that lowers the loss.
"""

from __future__ import annotations

import copy

import torch

from dflash_plugin.drafter import DFlashDraftModel


def deepen_drafter(drafter: DFlashDraftModel, num_layers: int) -> DFlashDraftModel:
    """The same drafter with `num_layers` layers; the added ones are identity maps at first."""
    have = len(drafter.layers)
    if num_layers < have:
        raise ValueError(f"cannot deepen a {have}-layer drafter to {num_layers} layers")
    if num_layers == have:
        return drafter
    config = copy.deepcopy(drafter.config)
    config.num_hidden_layers = num_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        config.layer_types = list(layer_types) + [layer_types[-1]] * (num_layers - have)
    weight = next(drafter.parameters())
    deeper = DFlashDraftModel(config).to(dtype=weight.dtype, device=weight.device)
    state = drafter.state_dict()
    last = f"layers.{have - 1}."
    for index in range(have, num_layers):
        for name, tensor in list(state.items()):
            if name.startswith(last):
                state[f"layers.{index}." + name[len(last):]] = tensor.clone()
        state[f"layers.{index}.self_attn.o_proj.weight"].zero_()
        state[f"layers.{index}.mlp.down_proj.weight"].zero_()
    deeper.load_state_dict(state, strict=True)
    return deeper.train(drafter.training)
