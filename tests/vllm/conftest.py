"""Shared fixtures for the vLLM plugin tests: the embedded target and small random drafters.

Engine tests start vLLM's CPU build (slow: ~1-3 min per engine). They run with
enforce_eager, float32 and a fixed KV-cache size so they neither compile nor depend on how much
memory other jobs leave free.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DRAFT_LAYER_IDS = [1, 8, 14, 20, 27]


@pytest.fixture(scope="session")
def target_path() -> Path:
    from dflash_plugin.target import ensure_default_target

    return ensure_default_target()


@pytest.fixture(scope="session")
def target_config(target_path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(target_path))


def save_random_drafter(path: Path, target_config, **overrides) -> Path:
    from dflash_plugin.checkpoint import save_drafter
    from dflash_plugin.config import make_config
    from dflash_plugin.drafter import DFlashDraftModel

    options = dict(num_draft_layers=2, block_size=16, mask_token_id=3,
                   target_layer_ids=DRAFT_LAYER_IDS) | overrides
    torch.manual_seed(0)
    save_drafter(DFlashDraftModel(make_config(target_config, **options)), path)
    return path


@pytest.fixture(scope="session")
def random_drafter(tmp_path_factory, target_config) -> Path:
    return save_random_drafter(tmp_path_factory.mktemp("drafters") / "random", target_config)


@pytest.fixture(scope="session")
def drafter_with_bad_layers(tmp_path_factory, target_config) -> Path:
    return save_random_drafter(tmp_path_factory.mktemp("drafters") / "bad-layers", target_config,
                               target_layer_ids=[1, 40])


@pytest.fixture(scope="session")
def drafter_for_wider_target(tmp_path_factory, target_config) -> Path:
    """A drafter trained for a 640-wide target (here: 576)."""
    wider = copy.deepcopy(target_config)
    wider.hidden_size, wider.num_attention_heads, wider.num_key_value_heads = 640, 10, 5
    return save_random_drafter(tmp_path_factory.mktemp("drafters") / "wider", wider)
