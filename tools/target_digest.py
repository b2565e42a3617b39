"""SHA-256 over a model folder's tensors (names, dtypes, shapes, bytes, in name order): the same
digest means the same weights whatever the safetensors file's layout or metadata.

    python tools/target_digest.py ~/.cache/dflash-plugin/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch
from safetensors import safe_open


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in sorted(f.keys()):
                tensor = f.get_tensor(name).contiguous()
                h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
                h.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    print(digest(Path(sys.argv[1])))
