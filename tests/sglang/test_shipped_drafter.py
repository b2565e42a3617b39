"""This project's own shipped drafter (SmolLM2-135M-Instruct-DFlash-b16) on SGLang: it passes
the adapter's checks, SGLang's loader builds and fills this plugin's drafter class from it, and
one draft step through the worker's KV injection and RadixAttention gives the core's output."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from dflash_plugin.checkpoint import load_drafter  # noqa: E402
from dflash_plugin.defaults import default_drafter_path  # noqa: E402
from dflash_plugin.layout import block_input_ids  # noqa: E402
from sglang_helpers import PagedDraftCache, build_sglang_drafter  # noqa: E402


@pytest.fixture(scope="module")
def shipped(plugins_loaded):
    path = default_drafter_path()
    return path, build_sglang_drafter(path)


def test_sglang_builds_this_plugins_class_for_the_shipped_drafter(shipped):
    _, model = shipped
    assert type(model).__module__.startswith("sglang_ext")
    assert model.fields.target_layer_ids == (1, 8, 14, 20, 27)


def test_shipped_drafter_drafts_as_the_core_on_sglang(shipped):
    path, model = shipped
    core = load_drafter(path, dtype=torch.float32)
    torch.manual_seed(0)
    embed = nn.Embedding(core.config.vocab_size, core.config.hidden_size)
    n, block, bonus = 12, core.block_size, 42
    features = torch.randn(n, core.fc.in_features)
    paged = PagedDraftCache(model)
    paged.inject(features, positions=torch.arange(n), cache_loc=paged.slots(1, 0, n))
    block_ids = torch.tensor([block_input_ids(bonus, core.mask_token_id, block)])
    hidden = paged.draft_hidden(model, [1], [n], block_ids, embed)[0]
    expected = core(embed(block_ids), core.fuse_context(features[None]),
                    torch.arange(n, n + block)[None], torch.arange(n)[None])[0]
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)
