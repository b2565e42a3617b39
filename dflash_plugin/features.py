"""Capturing target hidden states for the drafter from a Hugging Face causal LM.

Layer id N is the output of decoder layer N, i.e. `hidden_states[N + 1]` (see layout.py). We
hook the decoder layers instead of asking for all hidden states: only the selected layers are
kept, and the hooked value is the residual stream before the final norm for every layer.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from dflash_plugin.config import DFlashFields
from dflash_plugin.errors import MismatchError


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a Llama / Qwen2 / Qwen3-family causal LM."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise MismatchError(f"{type(model).__name__} has no model.layers: only decoder-only "
                            "Llama/Qwen-style Hugging Face targets are supported")
    return layers


def check_pair(target: nn.Module, fields: DFlashFields, draft_hidden: int, draft_vocab: int):
    """Refuse a drafter that does not fit the target, naming the mismatch."""
    config = getattr(target.config, "text_config", target.config)
    num_layers = len(decoder_layers(target))
    if fields.num_target_layers != num_layers:  # features from the wrong depths (as pair_check)
        raise MismatchError(f"drafter was trained for a target with {fields.num_target_layers} "
                            f"layers, the target has {num_layers}")
    bad_ids = [i for i in fields.target_layer_ids if not 0 <= i < num_layers]
    if bad_ids:
        raise MismatchError(f"drafter target_layer_ids {list(fields.target_layer_ids)} include "
                            f"{bad_ids}, but the target has only {num_layers} layers (0..{num_layers - 1})")
    if fields.target_hidden_size != config.hidden_size:
        raise MismatchError(f"drafter expects target hidden size {fields.target_hidden_size}, "
                            f"the target has {config.hidden_size}")
    if draft_hidden != config.hidden_size:
        raise MismatchError(f"drafter hidden size {draft_hidden} differs from the target's "
                            f"{config.hidden_size}: it borrows the target's embeddings and LM head")
    if draft_vocab != config.vocab_size:
        raise MismatchError(f"drafter vocab size {draft_vocab} differs from the target's "
                            f"{config.vocab_size}")
    if fields.mask_token_id >= config.vocab_size:
        raise MismatchError(f"mask_token_id {fields.mask_token_id} is outside the target's "
                            f"vocabulary of {config.vocab_size}")


class FeatureCapture:
    """Forward hooks that record the selected layers' outputs during target passes."""

    def __init__(self, target: nn.Module, layer_ids: tuple[int, ...] | list[int]):
        self.layers = decoder_layers(target)
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}

    def _hook(self, layer_id: int):
        def record(_module, _inputs, output):
            self._outputs[layer_id] = output[0] if isinstance(output, tuple) else output
        return record

    @contextmanager
    def active(self):
        handles = [self.layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def take(self) -> torch.Tensor:
        """Concatenated features [b, t, n_feat*H] of the last pass (and forget them)."""
        missing = [i for i in self.layer_ids if i not in self._outputs]
        if missing:
            raise RuntimeError(f"target layers {missing} did not run in the last pass")
        features = torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)
        self._outputs.clear()
        return features
