"""Prompt-lookup hints in the drafter's block (dflash_plugin/lookup_hints.py): the layout the
trainer writes is the one decoding writes, a drafter marked for hints keeps the mark through its
checkpoint, and decoding with hints stays token-identical to plain decoding (real SmolLM2)."""

from __future__ import annotations

import copy

import pytest
import torch

from dflash_plugin.lookup_hints import (
    enable_lookup_hints,
    fill_batch_hints,
    hinted_block,
    uses_lookup_hints,
)
from dflash_plugin.ngram import lookup_continuation
from dflash_plugin.train.batches import make_block_batch
from core_helpers import EOS

MASK = 0
# "7 8 9 4" recurs, so an anchor on its second "8" has a lookup match: "9 4 5 6 ..."
IDS = [1, 7, 8, 9, 4, 5, 6, 2, 7, 8, 9, 4, 3, 3]


def test_hinted_block_writes_the_lookup_continuation_then_masks():
    history = IDS[:10]  # ends "... 7 8": matches "7 8" earlier, followed by "9 4 5 6 2 7 8"
    block = hinted_block(8, MASK, 6, history)
    assert block == [8] + lookup_continuation(history, 5)
    assert block == [8, 9, 4, 5, 6, 2]
    assert hinted_block(3, MASK, 6, [1, 2, 3]) == [3, MASK, MASK, MASK, MASK, MASK]
    assert len(hinted_block(8, MASK, 16, history)) == 16


def test_fill_batch_hints_follows_each_anchors_history():
    anchors = torch.tensor([2, 9, 12])  # "8" (no earlier 8), second "8" (match), "3" (none)
    batch = make_block_batch(torch.tensor(IDS), anchors, 4, MASK, gamma=4.0)
    filled = fill_batch_hints(batch.block_ids, IDS, anchors, 4).view(3, 4)
    assert filled[0].tolist() == [8, MASK, MASK, MASK]
    assert filled[1].tolist() == [8, 9, 4, 5]  # the truth after it is 9 4 3: two right
    assert filled[2].tolist() == [3, MASK, MASK, MASK]
    assert torch.equal(batch.block_ids[::4], filled[:, 0])  # the anchors are untouched
    none = fill_batch_hints(batch.block_ids, IDS, anchors, 4, keep=0.0)
    assert torch.equal(none, batch.block_ids)


def test_fill_batch_hints_keeps_about_the_asked_share():
    ids = [5, 6, 7] * 40  # every anchor after the first period has a match
    anchors = torch.arange(10, 110)
    batch = make_block_batch(torch.tensor(ids), anchors, 4, MASK, gamma=4.0)
    g = torch.Generator().manual_seed(0)
    filled = fill_batch_hints(batch.block_ids, ids, anchors, 4, keep=0.5, generator=g)
    hinted = int((filled.view(-1, 4)[:, 1] != MASK).sum())
    assert 30 <= hinted <= 70


def test_the_mark_survives_a_checkpoint(tmp_path, shipped_drafter_f32):
    from dflash_plugin.checkpoint import load_drafter, save_drafter

    assert not uses_lookup_hints(shipped_drafter_f32)
    drafter = copy.deepcopy(shipped_drafter_f32)
    enable_lookup_hints(drafter)
    assert uses_lookup_hints(drafter) and not uses_lookup_hints(shipped_drafter_f32)
    save_drafter(drafter, tmp_path / "d", dtype=torch.float32)
    assert uses_lookup_hints(load_drafter(tmp_path / "d", dtype=torch.float32))


@pytest.mark.slow
def test_hinted_decoding_is_lossless_and_drafts_what_training_drafts(
        target_f32, tokenizer, shipped_drafter_f32, chat_prompts, plain_results):
    """Greedy decoding with hints equals plain decoding, the blocks carry the lookup's tokens,
    and teacher-forced acceptance (the trainer's layout) equals what decoding accepted."""
    from dflash_plugin.adaptive_decode import AdaptiveSpecDecoder
    from dflash_plugin.features import FeatureCapture
    from dflash_plugin.generate import SpecDecoder, generate_plain
    from dflash_plugin.prompt_io import encode_user_turn
    from dflash_plugin.train.feature_store import target_features
    from dflash_plugin.train.teacher_forced import block_acceptance

    drafter = copy.deepcopy(shipped_drafter_f32)
    enable_lookup_hints(drafter)
    copying = torch.tensor([encode_user_turn(tokenizer, "Repeat this sentence exactly three "
                                             "times: The old river bank is quiet at night.")])
    cases = [(chat_prompts[0], plain_results(0).token_ids[:48]),
             (copying, generate_plain(target_f32, copying, 48, stop_token_ids={EOS}).token_ids)]
    hinted_blocks = compared = 0
    for prompt, plain in cases:
        decoder = SpecDecoder(target_f32, drafter)
        blocks = []
        original = decoder.block_ids
        decoder.block_ids = lambda bonus, block: blocks.append(original(bonus, block)) or blocks[-1]
        out = decoder.generate(prompt, 48, stop_token_ids={EOS})
        assert out.token_ids == plain
        hinted_blocks += sum(b[1] != drafter.mask_token_id for b in blocks)
        adaptive = AdaptiveSpecDecoder(target_f32, drafter).generate(prompt, 48,
                                                                    stop_token_ids={EOS})
        assert adaptive.token_ids == plain
        ids = prompt[0].tolist() + out.token_ids
        capture = FeatureCapture(target_f32, drafter.fields.target_layer_ids)
        with capture.active():
            feats = target_features(target_f32, capture, ids, torch.float32)
        accepted = block_acceptance(drafter, target_f32.get_input_embeddings(),
                                    target_f32.get_output_embeddings(), feats, ids,
                                    prompt.shape[1])
        anchor = 0
        for step_accepted in out.stats.accept_lengths[:-1]:  # the last is cut by the length
            assert int(accepted[anchor]) == step_accepted, anchor
            compared += 1
            anchor += step_accepted
    assert hinted_blocks > 0 and compared >= 8
