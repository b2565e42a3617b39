"""Drafter configuration in the published DFlash checkpoint format.

A DFlash `config.json` is an ordinary Qwen3 config (`model_type: qwen3`) plus
`architectures: ["DFlashDraftModel"]`, a top-level `block_size` and `num_target_layers`, and
`dflash_config: {target_layer_ids, mask_token_id}`. We keep the whole Hugging Face config object
so that unknown fields of newer checkpoints survive a round trip, and read the DFlash fields
through `DFlashFields`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig, Qwen3Config

try:
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # older huggingface_hub: configs are not validated field by field
    StrictDataclassError = ValueError

from dflash_plugin.errors import CheckpointError
from dflash_plugin.layout import default_target_layer_ids

ARCHITECTURE = "DFlashDraftModel"


@dataclass(frozen=True)
class DFlashFields:
    """The DFlash-specific settings of a drafter config."""

    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int
    target_hidden_size: int
    draft_vocab_size: int | None  # set only for a reduced draft vocabulary with a d2t map
    # Trained to read the prompt lookup's continuation in its mask slots (lookup_hints.py).
    lookup_hints: bool = False

    def __post_init__(self):
        if self.block_size < 2:
            raise CheckpointError(f"block_size must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise CheckpointError("dflash_config.target_layer_ids is empty")
        if self.mask_token_id < 0:
            raise CheckpointError(f"mask_token_id must be >= 0, got {self.mask_token_id}")


def dflash_fields(config: PretrainedConfig) -> DFlashFields:
    """Read and check the DFlash fields of a drafter config."""
    extra = getattr(config, "dflash_config", None) or {}
    if "mask_token_id" not in extra or "target_layer_ids" not in extra:
        raise CheckpointError(
            "not a DFlash drafter config: dflash_config needs mask_token_id and target_layer_ids")
    block_size = getattr(config, "block_size", None) or extra.get("block_size")
    if block_size is None:
        raise CheckpointError("DFlash config has no block_size (top level or in dflash_config)")
    num_target_layers = getattr(config, "num_target_layers", None)
    if num_target_layers is None:
        raise CheckpointError("DFlash config has no num_target_layers")
    return DFlashFields(
        block_size=int(block_size),
        target_layer_ids=tuple(int(i) for i in extra["target_layer_ids"]),
        mask_token_id=int(extra["mask_token_id"]),
        num_target_layers=int(num_target_layers),
        target_hidden_size=int(getattr(config, "target_hidden_size", None)
                               or extra.get("target_hidden_size") or config.hidden_size),
        draft_vocab_size=getattr(config, "draft_vocab_size", None),
        lookup_hints=bool(extra.get("lookup_hints", False)),
    )


def load_config(path: str | Path) -> Qwen3Config:
    """Load `config.json` from a drafter folder, with a clear error when it is not one."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"no config.json in drafter folder {path}")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_file} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file} holds a JSON {type(raw).__name__}, not an object")
    if raw.get("model_type") != "qwen3":
        raise CheckpointError(
            f"{config_file}: model_type is {raw.get('model_type')!r}; DFlash drafters are 'qwen3'")
    try:
        config = Qwen3Config.from_dict(raw)
        dflash_fields(config)  # validate early
    except (TypeError, ValueError, StrictDataclassError) as err:  # a field of the wrong type
        raise CheckpointError(f"{config_file} is not a valid drafter config: {err}") from err
    return config


def make_config(target_config: PretrainedConfig, *, num_draft_layers: int, block_size: int,
                mask_token_id: int, target_layer_ids: list[int] | None = None,
                draft_vocab_size: int | None = None) -> Qwen3Config:
    """A drafter config whose layers have the target's shape (the paper's design)."""
    text_config = getattr(target_config, "text_config", target_config)
    num_target_layers = text_config.num_hidden_layers
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(num_target_layers, num_draft_layers)
    num_heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // num_heads
    config = Qwen3Config(
        vocab_size=text_config.vocab_size,
        hidden_size=text_config.hidden_size,
        intermediate_size=text_config.intermediate_size,
        num_hidden_layers=num_draft_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=getattr(text_config, "num_key_value_heads", num_heads),
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=text_config.max_position_embeddings,
        rms_norm_eps=text_config.rms_norm_eps,
        rope_parameters=dict(text_config.rope_parameters),
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=text_config.bos_token_id,
        eos_token_id=text_config.eos_token_id,
    )
    config.architectures = [ARCHITECTURE]
    config.block_size = block_size
    config.num_target_layers = num_target_layers
    config.dflash_config = {"mask_token_id": int(mask_token_id),
                            "target_layer_ids": [int(i) for i in target_layer_ids]}
    if draft_vocab_size is not None:
        config.draft_vocab_size = int(draft_vocab_size)
    dflash_fields(config)
    return config
