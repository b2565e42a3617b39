"""Shared fixtures: the real SmolLM2 target (float32 and bfloat16, loaded once per session),
random-weight drafters, and a tiny random Llama target for fast statistical tests."""

from __future__ import annotations

import os

import pytest
import torch

from core_helpers import EOS, PLAIN_MAX_NEW, PROMPTS, make_drafter, tiny_llama

# On a small shared CPU, many threads fight each other; one thread is far faster (measured
# ~30x under load). Override with DFLASH_TEST_THREADS.
torch.set_num_threads(int(os.environ.get("DFLASH_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def smollm_f32():
    from dflash_plugin.target import load_target
    return load_target(None, torch.float32)


@pytest.fixture(scope="session")
def smollm_bf16():
    from dflash_plugin.target import load_target
    return load_target(None, torch.bfloat16)


@pytest.fixture(scope="session")
def target_f32(smollm_f32):
    return smollm_f32[0]


@pytest.fixture(scope="session")
def tokenizer(smollm_f32):
    return smollm_f32[1]


@pytest.fixture(scope="session")
def drafter_f32(target_f32):
    return make_drafter(target_f32)


@pytest.fixture(scope="session")
def chat_prompts(tokenizer):
    from dflash_plugin.prompt_io import encode_user_turn
    return [torch.tensor([encode_user_turn(tokenizer, p)])
            for p in PROMPTS]


@pytest.fixture(scope="session")
def plain_results(target_f32, chat_prompts):
    """Plain greedy decoding of chat prompt i (float32, PLAIN_MAX_NEW tokens, stopping at EOS),
    computed once for every test that compares against it."""
    from dflash_plugin.generate import generate_plain
    cache = {}

    def get(i):
        if i not in cache:
            cache[i] = generate_plain(target_f32, chat_prompts[i], PLAIN_MAX_NEW,
                                      stop_token_ids={EOS})
        return cache[i]
    return get


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_llama(seed=0, vocab_size=16, logit_scale=10.0)


@pytest.fixture(scope="session")
def shipped_drafter_f32(target_f32):
    """As `dflash generate` loads it: drafting over its training vocabulary (draft_vocab.json)."""
    from dflash_plugin.checkpoint import load_drafter
    from dflash_plugin.defaults import default_drafter_path
    from dflash_plugin.draft_vocab import restricted_to_draft_vocab

    folder = default_drafter_path()
    drafter = load_drafter(folder, dtype=torch.float32)
    drafter = restricted_to_draft_vocab(drafter, target_f32.get_output_embeddings().weight.data,
                                        folder)
    assert drafter.lm_head is not None and drafter.d2t is not None
    return drafter
