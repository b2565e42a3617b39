"""Read and write drafter checkpoints in the published DFlash format (config.json + safetensors,
no embedding or LM head unless the draft vocabulary is reduced), with errors that say what is
wrong instead of loading garbage."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dflash_plugin.config import load_config
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.errors import CheckpointError

WEIGHTS_NAME = "model.safetensors"
# Buffers that are rebuilt from the config, never stored.
_DERIVED = ("rotary_emb.",)


def _weight_files(path: Path) -> list[Path]:
    index = path / f"{WEIGHTS_NAME}.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in drafter folder {path}")
    return files


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(Path(path)):
        if not file.is_file():
            raise CheckpointError(f"weight shard {file} is missing")
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"cannot read {file}: it is corrupt or not safetensors ({err})") from err
    return state


def load_drafter(path: str | Path, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu") -> DFlashDraftModel:
    """Build a drafter from a checkpoint folder; every tensor must be present and fit."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"drafter checkpoint folder {path} does not exist")
    config = load_config(path)
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    expected = {k: v for k, v in model.state_dict().items() if not k.startswith(_DERIVED)}
    state = read_state_dict(path)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match its config.json: missing {missing[:8]}, "
                              f"unexpected {unexpected[:8]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, "
                                  f"config.json implies {tuple(expected[name].shape)}")
    model = DFlashDraftModel(config)  # real tensors (rotary buffers computed from the config)
    model.load_state_dict(state, strict=False)
    return model.to(device=device, dtype=dtype).eval()


def save_drafter(model: DFlashDraftModel, path: str | Path, dtype: torch.dtype = torch.bfloat16):
    """Write config.json + model.safetensors (bf16 by default, like the released drafters)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()
             if not k.startswith(_DERIVED)}
    state = {k: (v if k == "d2t" else v.to(dtype)) for k, v in state.items()}
    tmp = path / f"{WEIGHTS_NAME}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / WEIGHTS_NAME)
    config = model.config
    config.dtype = str(dtype).removeprefix("torch.")
    config.save_pretrained(str(path))
