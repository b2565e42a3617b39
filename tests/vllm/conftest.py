"""Shared fixtures for the vLLM plugin tests: the embedded target and small random drafters.

Engine tests start vLLM's CPU build (slow: ~0.5-1 min per engine). They run with
enforce_eager, float32 and a fixed KV-cache size so they neither compile nor depend on how much
memory other jobs leave free. Their reference answers all come from one plain engine that stays
up, idle, for the whole session (`plain_llm`).
"""

from __future__ import annotations

import copy
import os
from contextlib import ExitStack
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


# Wide enough for every module's references: batches of up to 128 sampled requests, 1,024-token
# chat prompts.
PLAIN_ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, seed=0, max_num_seqs=128,
                         kv_cache_memory_bytes=1 << 30, enforce_eager=True)


@pytest.fixture(scope="session")
def plain_llm(target_path):
    """vLLM without speculation, started once and kept up, idle, while the other engines come
    and go (one engine start less per module). The plugin is loaded as usual (its arena cache
    included). A callable sent with collective_rpc needs
    `environment(VLLM_ALLOW_INSECURE_SERIALIZATION="1")` around the call."""
    from engine_helpers import engine, environment

    with ExitStack() as stack:
        # Set while its worker starts only: later engines and servers get the suite's own env.
        with environment(VLLM_ALLOW_INSECURE_SERIALIZATION="1"):
            llm = stack.enter_context(engine(target_path, None, num_speculative_tokens=0,
                                             **PLAIN_ENGINE_ARGS))
        yield llm
