"""The SGLang drafter drafts exactly what the shared core drafts, for the same checkpoint, context
and bonus tokens: KV injection through the DFLASH worker's own code into SGLang's paged pool,
block drafting through RadixAttention (torch fallback backend), over two rounds and a batch of
requests with different context lengths (the second round injects a partially accepted block, the
worker's prefix-valid path)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from dflash_plugin.checkpoint import load_drafter  # noqa: E402
from dflash_plugin.layout import block_input_ids  # noqa: E402
from sglang_helpers import HIDDEN, MASK, VOCAB, PagedDraftCache  # noqa: E402

CONTEXT_LENS = [5, 11, 8]
ACCEPTED = [2, 0, 3]  # drafts accepted in round 1 (the block size is 4: 0..3)


@pytest.fixture(scope="module")
def target_parts():
    torch.manual_seed(1)
    return nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)


def core_round(core, cache, features, start, bonus, embed):
    """The core's draft step (as SpecDecoder.draft): inject `features` at positions
    [len(cache), start), then fill the block [bonus, MASK...] at `start`."""
    ids = torch.tensor([block_input_ids(bonus, MASK, core.block_size)])
    context = core.fuse_context(features)
    ctx_positions = torch.arange(len(cache), start)[None]
    block_positions = torch.arange(start, start + core.block_size)[None]
    return core(embed(ids), context, block_positions, ctx_positions, cache=cache)[0]


def test_sglang_drafter_drafts_the_core_tokens(tiny, sglang_drafter, target_parts):
    embed, lm_head = target_parts
    core = load_drafter(tiny.drafter_dir, dtype=torch.float32)
    model = sglang_drafter
    block, features_dim = core.block_size, core.fc.in_features
    gen = torch.Generator().manual_seed(2)
    paged = PagedDraftCache(model)
    rows = list(range(1, len(CONTEXT_LENS) + 1))
    caches = [core.new_cache() for _ in rows]
    prefix = list(CONTEXT_LENS)
    bonus = torch.randint(0, VOCAB - 1, (len(rows),), generator=gen)
    drafted = []

    # Round 0: prefill features of each prompt, injected at the prompt's slots.
    prompt_features = [torch.randn(n, features_dim, generator=gen) for n in CONTEXT_LENS]
    paged.inject(torch.cat(prompt_features),
                 positions=torch.cat([torch.arange(n) for n in CONTEXT_LENS]),
                 cache_loc=torch.cat([paged.slots(r, 0, n) for r, n in zip(rows, CONTEXT_LENS)]))
    pending = [f[None] for f in prompt_features]

    for round_ in range(2):
        block_ids = torch.tensor([block_input_ids(int(b), MASK, block) for b in bonus])
        hidden = paged.draft_hidden(model, rows, prefix, block_ids, embed)
        for i, row in enumerate(rows):
            expected = core_round(core, caches[i], pending[i], prefix[i], int(bonus[i]), embed)
            torch.testing.assert_close(hidden[i], expected, rtol=1e-5, atol=1e-5)
            ours = lm_head(hidden[i, 1:]).argmax(-1)
            theirs = lm_head(expected[1:]).argmax(-1)
            assert ours.tolist() == theirs.tolist(), f"round {round_}, request {i}"
            drafted.append(tuple(ours.tolist()))
        if round_ == 1:
            break
        # Round 1: the target verified each block; the first ACCEPTED[i] drafts plus the bonus are
        # committed, and the target's features of those positions are injected (the worker's
        # verify path: the whole block's slots, only the committed prefix written).
        verify_features = torch.randn(len(rows), block, features_dim, generator=gen)
        commit = torch.tensor(ACCEPTED) + 1
        block_slots = torch.stack([paged.slots(r, p, p + block) for r, p in zip(rows, prefix)])
        positions = torch.tensor(prefix)[:, None] + torch.arange(block)[None]
        paged.inject(verify_features.reshape(-1, features_dim), positions=positions.reshape(-1),
                     cache_loc=block_slots.reshape(-1), cache_loc_2d=block_slots,
                     commit_lens=commit.int())
        pending = [verify_features[i, :c][None] for i, c in enumerate(commit.tolist())]
        prefix = [p + c for p, c in zip(prefix, commit.tolist())]
        bonus = torch.randint(0, VOCAB - 1, (len(rows),), generator=gen)

    assert len(set(drafted)) > 1, "degenerate drafter: every block drafted the same tokens"


def test_block_size_follows_the_worker(sglang_drafter):
    model = sglang_drafter
    assert model.block_size == model.fields.block_size
    model.set_block_size(2)
    try:
        assert model.block_size == 2
    finally:
        model.set_block_size(model.fields.block_size)


def test_bfloat16_embeddings_from_the_runner_are_accepted(sglang_drafter, target_parts):
    """SGLang's model runner hands the block's embeddings over as bfloat16 (for any model dtype)."""
    embed, _ = target_parts
    paged = PagedDraftCache(sglang_drafter)
    n = 6
    paged.inject(torch.randn(n, sglang_drafter.fc.in_features), positions=torch.arange(n),
                 cache_loc=paged.slots(1, 0, n))
    block_ids = torch.tensor([block_input_ids(7, MASK, sglang_drafter.block_size)])
    exact = paged.draft_hidden(sglang_drafter, [1], [n], block_ids, embed)
    rounded = paged.draft_hidden(sglang_drafter, [1], [n], block_ids,
                                 lambda ids: embed(ids).bfloat16())
    assert rounded.dtype == torch.float32
    torch.testing.assert_close(rounded, exact, rtol=0.05, atol=0.05)
