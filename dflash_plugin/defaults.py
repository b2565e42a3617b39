"""Where the embedded defaults live: the SmolLM2 target (built on first use, see target.py) and
the project's own trained drafter, shipped inside the package."""

from __future__ import annotations

from pathlib import Path

from dflash_plugin.errors import CheckpointError

DRAFTERS_DIR = Path(__file__).parent / "drafters"
DEFAULT_DRAFTER_NAME = "SmolLM2-135M-Instruct-DFlash-b16"


def default_drafter_path() -> Path:
    path = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
    if not (path / "config.json").is_file():
        raise CheckpointError(f"the shipped drafter {path} is missing; pass --draft PATH")
    return path
