"""Change a trained drafter's depth without starting from scratch.

Growing: each new layer is a copy of the last trained one with its two output projections
(attention `o_proj`, MLP `down_proj`) zeroed, so its residual branches add nothing and the deeper
drafter drafts exactly what the shallower one did. Training then moves the new layers away from
the identity only where that lowers the loss.

Shrinking: a cheaper drafter keeps some of a deeper one's layers (its `fc`, `hidden_norm`, final
norm and head unchanged), which drafts far closer to the deep one than layers copied from the
target do, so that a short fine-tune recovers what the dropped layers did.
"""

from __future__ import annotations

import copy

import torch

from dflash_plugin.drafter import DFlashDraftModel


def _rebuilt(drafter: DFlashDraftModel, sources: list[int]) -> DFlashDraftModel:
    """A drafter whose layer i is a copy of `drafter`'s layer sources[i]; every other tensor
    (`fc`, norms, head) as it is."""
    config = copy.deepcopy(drafter.config)
    config.num_hidden_layers = len(sources)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        config.layer_types = [layer_types[i] for i in sources]
    weight = next(drafter.parameters())
    rebuilt = DFlashDraftModel(config).to(dtype=weight.dtype, device=weight.device)
    state, old = {}, drafter.state_dict()
    for name, tensor in old.items():
        if not name.startswith("layers."):
            state[name] = tensor
    for new_index, old_index in enumerate(sources):
        prefix = f"layers.{old_index}."
        for name, tensor in old.items():
            if name.startswith(prefix):
                state[f"layers.{new_index}.{name[len(prefix):]}"] = tensor.clone()
    rebuilt.load_state_dict(state, strict=True)
    return rebuilt.train(drafter.training)


def deepen_drafter(drafter: DFlashDraftModel, num_layers: int) -> DFlashDraftModel:
    """The same drafter with `num_layers` layers; the added ones are identity maps at first."""
    have = len(drafter.layers)
    if num_layers < have:
        raise ValueError(f"cannot deepen a {have}-layer drafter to {num_layers} layers")
    if num_layers == have:
        return drafter
    deeper = _rebuilt(drafter, [*range(have), *[have - 1] * (num_layers - have)])
    with torch.no_grad():
        for layer in deeper.layers[have:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return deeper


def default_kept_layers(have: int, num_layers: int) -> list[int]:
    """Which of `have` layers a `num_layers`-layer drafter keeps by default: the first
    `num_layers - 1` and the last (whose output the head reads). A drafter grown by identity
    layers learns most in its first ones: of the shipped 8-layer SmolLM2 drafter, layers 0, 1,
    2 and 7 kept 98% of its teacher-forced tau on real prompts, evenly spaced 0, 3, 5, 7 only 74%
    (docs/history.md, "Fewer layers")."""
    if not 1 <= num_layers <= have:
        raise ValueError(f"cannot keep {num_layers} of a {have}-layer drafter's layers")
    return [*range(num_layers - 1), have - 1]


def shallower_drafter(drafter: DFlashDraftModel, keep: list[int]) -> DFlashDraftModel:
    """The drafter with only the layers `keep` (ascending indices into its layers)."""
    have = len(drafter.layers)
    if not keep or sorted(set(keep)) != list(keep) or keep[0] < 0 or keep[-1] >= have:
        raise ValueError(f"layers to keep {keep}: give distinct ascending indices of the "
                         f"drafter's {have} layers (0-{have - 1})")
    return _rebuilt(drafter, list(keep))
