"""Small operations on a Hugging Face DynamicCache of the target: drop rejected entries, or keep
only the accepted nodes of a verified draft tree."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def truncate(cache: DynamicCache, length: int):
    """Keep the first `length` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def keep_positions(cache: DynamicCache, length: int, tail_indices: list[int]):
    """Keep the first `length` positions followed by the tail entries at `tail_indices`
    (absolute cache indices, in order): how a tree's accepted path becomes contiguous."""
    truncate_to = length + len(tail_indices)
    if tail_indices != list(range(length, truncate_to)):
        for layer in cache.layers:
            index = torch.tensor(tail_indices, device=layer.keys.device)
            layer.keys[:, :, length:truncate_to] = layer.keys.index_select(2, index)
            layer.values[:, :, length:truncate_to] = layer.values.index_select(2, index)
    truncate(cache, truncate_to)
