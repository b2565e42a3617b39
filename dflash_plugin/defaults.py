"""Where the embedded defaults live: the SmolLM2 target (built on first use, see target.py), the
project's own trained drafter, shipped inside the package, and the target's training answers
that serve as its retrieval datastore (dflash_plugin.datastore) in a repository checkout."""

from __future__ import annotations

from pathlib import Path

from dflash_plugin.errors import CheckpointError

DRAFTERS_DIR = Path(__file__).parent / "drafters"
DEFAULT_DRAFTER_NAME = "SmolLM2-135M-Instruct-DFlash-b16"
REPO_ROOT = Path(__file__).resolve().parent.parent
# The embedded target's greedy answers to the training prompts (no evaluation prompt among
# them): 9.5M tokens in train_data/ of a repository checkout, which an installed package lacks.
DEFAULT_DATASTORE_FILES = (
    "train_data/smollm2-135m-real/responses.partial.jsonl.gz",
    "train_data/smollm2-135m/responses.jsonl.gz",
    *(f"train_data/smollm2-135m/responses_extra{i}.jsonl.gz" for i in range(1, 5)),
    "train_data/smollm2-135m-self/responses.jsonl.gz",
)


def default_drafter_path() -> Path:
    path = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
    if not (path / "config.json").is_file():
        raise CheckpointError(f"the shipped drafter {path} is missing; pass --draft PATH")
    return path


def default_datastore_files(root: Path = REPO_ROOT) -> list[Path]:
    """The embedded target's answer files that are there ([] outside a repository checkout)."""
    return [root / name for name in DEFAULT_DATASTORE_FILES if (root / name).is_file()]
