"""The block layout rules (dflash_plugin/layout.py), and parity between the training batch and
what the inference loop actually feeds the drafter and verifies."""

import math

import pytest
import torch
from core_helpers import ProposingDecoder, make_drafter

from dflash_plugin.generate import generate_plain
from dflash_plugin.layout import (
    block_input_ids,
    block_positions,
    default_gamma,
    default_target_layer_ids,
    loss_weights,
    training_attention_mask,
    training_block_positions,
)
from dflash_plugin.train.batches import make_block_batch, sample_anchors


@pytest.mark.parametrize("layers, k, ids", [
    (36, 5, [1, 9, 17, 25, 33]),   # Qwen3-4B/8B, as in the released configs
    (32, 5, [1, 8, 15, 22, 29]),   # LLaMA-3.1-8B
    (36, 1, [18]),                 # one draft layer: the middle layer
    (30, 2, [1, 27]),              # SmolLM2-135M with 2 draft layers: first = 1, last = L-3
    (4, 3, [1, 1, 1]),
])
def test_default_target_layer_ids(layers, k, ids):
    assert default_target_layer_ids(layers, k) == ids


def test_default_target_layer_ids_bounds():
    for layers in range(4, 80):
        for k in range(2, 9):
            ids = default_target_layer_ids(layers, k)
            assert ids[0] == 1 and ids[-1] == layers - 3 and ids == sorted(ids)
    with pytest.raises(ValueError, match="at least 4 layers"):
        default_target_layer_ids(3, 2)
    with pytest.raises(ValueError, match="num_draft_layers"):
        default_target_layer_ids(36, 0)


def test_block_ids_and_positions():
    assert block_input_ids(42, 7, 4) == [42, 7, 7, 7]
    assert block_positions(10, 4).tolist() == [10, 11, 12, 13]
    assert training_block_positions(torch.tensor([3, 9]), 3).tolist() == [3, 4, 5, 9, 10, 11]


def test_loss_weights():
    w = loss_weights(16, 7.0)
    assert w[0] == 0.0 and w[1] == pytest.approx(1.0)
    for k in range(1, 16):
        assert w[k] == pytest.approx(math.exp(-(k - 1) / 7.0))
    assert all(w[k] > w[k + 1] for k in range(1, 15))
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)
    assert 4.0 < default_gamma(12) < 7.0


def reference_mask(anchors, context_len, block_size, valid=None):
    """The rules, spelled out one query and one key at a time."""
    n = len(anchors)
    mask = torch.zeros(n * block_size, context_len + n * block_size, dtype=torch.bool)
    for q in range(n * block_size):
        j = q // block_size
        if valid is not None and not valid[j]:
            continue
        for k in range(context_len):
            mask[q, k] = k < anchors[j]  # strictly before the anchor
        for k in range(n * block_size):
            mask[q, context_len + k] = k // block_size == j  # own block, both directions
    return mask


def test_training_attention_mask_rules():
    anchors, s, b = [2, 5, 6], 9, 3
    got = training_attention_mask(torch.tensor(anchors), s, b)
    assert got.dtype == torch.bool and got.shape == (9, 18)
    assert torch.equal(got, reference_mask(anchors, s, b))
    # spot checks of each rule
    assert got[0, :2].all() and not got[0, 2:s].any()       # block 0 sees context 0, 1 only
    assert got[2, s:s + 3].all() and not got[2, s + 3:].any()  # bidirectional in its block
    assert not got[3, s:s + 3].any()                         # no cross-block keys


def test_training_attention_mask_invalid_blocks_see_nothing():
    anchors, valid = [1, 4], torch.tensor([True, False])
    got = training_attention_mask(torch.tensor(anchors), 6, 4, valid)
    assert torch.equal(got, reference_mask(anchors, 6, 4, valid))
    assert not got[4:].any() and got[:4].any()


def test_make_block_batch_on_a_toy_sequence():
    ids = torch.arange(100, 112)  # 12 tokens
    batch = make_block_batch(ids, torch.tensor([4, 9]), 4, 99, gamma=4.0)
    assert batch.block_ids.tolist() == [104, 99, 99, 99, 109, 99, 99, 99]
    assert batch.block_positions.tolist() == [4, 5, 6, 7, 9, 10, 11, 12]
    assert batch.labels[:7].tolist() == [104, 105, 106, 107, 109, 110, 111]
    w = loss_weights(4, 4.0)
    # position 12 is past the end of the sequence: no loss there
    assert torch.allclose(batch.weights, torch.cat([w, w[:3], torch.zeros(1)]))
    assert batch.context_len == 12 and batch.num_blocks == 2


def test_sample_anchors_are_response_tokens_with_a_successor():
    gen = torch.Generator().manual_seed(0)
    anchors = sample_anchors(5, 12, 100, gen)
    assert anchors.tolist() == list(range(5, 11))
    with pytest.raises(ValueError):
        sample_anchors(5, 6, 2, gen)


def test_training_batch_matches_inference_loop(tiny_target):
    """Record what the inference loop feeds the drafter (block ids, positions, visible context)
    and what it verifies, then build the training batch at the same anchors: they agree."""
    block_size, mask, prompt = 4, 15, [0, 5, 9, 3, 7, 2]
    ids = torch.tensor([prompt])
    ref = generate_plain(tiny_target, ids, 24).token_ids
    wrong = {2, 3, 9, 14, 15}  # irregular acceptance -> irregular anchors
    drafter = make_drafter(tiny_target, block_size=block_size, mask_token_id=mask)
    decoder = ProposingDecoder(
        tiny_target, drafter, block_size, len(prompt),
        lambda seq: (ref[len(seq)] + 1) % 16 if len(seq) in wrong else ref[len(seq)])

    seen = []

    def record(_module, args, kwargs):
        block_embeds, context, block_pos, ctx_pos = args
        seen.append(dict(block_positions=block_pos[0].tolist(), ctx_positions=ctx_pos[0].tolist(),
                         cached=len(kwargs["cache"]), block_len=block_embeds.shape[1]))

    embedded = []
    inner_embed = decoder.embed
    decoder.embed = lambda x: (embedded.append(x[0].tolist()), inner_embed(x))[1]
    handle = drafter.register_forward_pre_hook(record, with_kwargs=True)
    try:
        result = decoder.generate(ids, 24)
    finally:
        handle.remove()
    assert result.token_ids == ref

    seq = torch.tensor(prompt + ref)
    anchors = [call["block_positions"][0] for call in seen]
    assert anchors[0] == len(prompt) and len(set(anchors)) == len(anchors) > 3
    assert all(a in sample_anchors(len(prompt), len(seq), 10**6, torch.Generator()).tolist()
               for a in anchors)
    batch = make_block_batch(seq, torch.tensor(anchors), block_size, mask, gamma=4.0)
    for j, (call, block_ids) in enumerate(zip(seen, embedded)):
        a, n = anchors[j], call["block_len"]  # the last blocks may be shorter
        rows = slice(j * block_size, j * block_size + n)
        assert batch.block_ids[rows].tolist() == block_ids
        assert batch.block_positions[rows].tolist() == call["block_positions"]
        # labels at offsets 1.. are the tokens the verifier accepts there (greedy = ref)
        assert batch.labels[rows].tolist() == seq[a:a + n].tolist()
        # the drafter saw context positions 0..a-1 (cached + new), the mask allows k < a
        assert call["cached"] + len(call["ctx_positions"]) == a
        assert call["ctx_positions"] == list(range(call["cached"], a))
        row = batch.attn_mask[j * block_size]
        assert row[:len(seq)].tolist() == [k < a for k in range(len(seq))]


def test_blockwise_training_attention_equals_the_dense_mask(tiny_target):
    """The trainer's factored attention (layout.BlockwiseMask) computes exactly what the dense
    [N*B, S + N*B] mask gives, values and gradients."""
    from dflash_plugin.layout import training_blockwise_mask

    block_size, seq_len = 4, 23
    drafter = make_drafter(tiny_target, block_size=block_size, dtype=torch.float32).train()
    anchors = torch.tensor([3, 7, 8, 15, 21])
    batch = make_block_batch(torch.arange(seq_len) % 16, anchors, block_size, 2, gamma=4.0)
    features = torch.randn(1, seq_len, drafter.fc.in_features)
    block = tiny_target.get_input_embeddings()(batch.block_ids)[None].detach()

    def run(mask):
        drafter.zero_grad()
        hidden = drafter(block, drafter.fuse_context(features), batch.block_positions[None],
                         torch.arange(seq_len)[None], attn_mask=mask)
        hidden.pow(2).sum().backward()
        return hidden.detach(), drafter.fc.weight.grad.clone()

    dense = run(batch.attn_mask[None, None])
    blockwise = run(training_blockwise_mask(anchors, seq_len, block_size))
    assert torch.allclose(dense[0], blockwise[0], atol=1e-5)
    assert torch.allclose(dense[1], blockwise[1], atol=1e-4, rtol=1e-4)
