"""Block-start anchors (train/block_starts.py): the cheap first-draft pass drafts what decoding
would draft after each position (checked against the inference path on the real target and the
shipped drafter), its weights favour the positions after a wrong first draft, and the trainer
samples and logs with them."""

import json

import pytest
import torch

from dflash_plugin.features import FeatureCapture
from dflash_plugin.prompt_io import encode_user_turn
from dflash_plugin.train.block_starts import (
    START_RATE_AFTER_RIGHT_DRAFT,
    block_start_weights,
    first_draft_hits,
    first_drafts,
    sample_weighted_anchors,
)


def test_weights_favour_positions_after_a_wrong_first_draft():
    # hits[i]: the first draft from answer position i was right about position i + 1
    hits = torch.tensor([True, False, True, True, False])
    weights = block_start_weights(hits)
    rate = START_RATE_AFTER_RIGHT_DRAFT
    # position 0 always starts a block; 1 follows a right draft, 2 a wrong one, ...
    assert weights.tolist() == pytest.approx([1.0, rate, 1.0, rate, rate])


def test_weighted_anchors_are_sorted_distinct_answer_positions():
    generator = torch.Generator().manual_seed(0)
    weights = torch.full((50,), 1e-6)
    weights[[3, 17, 40]] = 1.0
    anchors = sample_weighted_anchors(10, weights, 3, generator)
    assert anchors.tolist() == [13, 27, 50]  # the heavy positions, offset by the prompt
    everything = sample_weighted_anchors(10, torch.ones(5), 8, generator)
    assert everything.tolist() == [10, 11, 12, 13, 14]  # fewer candidates than anchors: all


@pytest.fixture(scope="module")
def answered(target_f32, tokenizer):
    """A real prompt and the target's own greedy answer, with the captured features."""
    from dflash_plugin.generate import generate_plain
    from dflash_plugin.sampling import SamplingParams
    prompt = encode_user_turn(tokenizer, "List four farm animals.")
    answer = generate_plain(target_f32, torch.tensor([prompt]), 24,
                            SamplingParams(temperature=0.0), 0, set()).token_ids
    return torch.tensor(prompt + list(answer)), len(prompt)


def test_first_drafts_are_what_decoding_would_draft_after_each_position(
        target_f32, shipped_drafter_f32, answered):
    ids, prompt_len = answered
    drafter = shipped_drafter_f32
    capture = FeatureCapture(target_f32, list(drafter.fields.target_layer_ids))
    with torch.no_grad(), capture.active():
        target_f32.model(ids[None], use_cache=False)
        features = capture.take()[0].float()
    embed, head = target_f32.get_input_embeddings(), target_f32.get_output_embeddings()
    with torch.no_grad():
        drafts = first_drafts(drafter, embed, head, ids, drafter.fuse_context(features[None]),
                              prompt_len)
        assert drafts.numel() == ids.numel() - 1 - prompt_len
        for anchor in range(prompt_len, ids.numel() - 1, 5):
            # The inference path: only the context before the anchor, no mask, one block.
            block = torch.tensor([[ids[anchor], drafter.mask_token_id]])
            hidden = drafter(embed(block), drafter.fuse_context(features[None, :anchor]),
                             torch.tensor([[anchor, anchor + 1]]), torch.arange(anchor)[None])
            expected = drafter.to_target_ids(drafter.draft_logits(hidden[0, 1:], head).argmax(-1))
            assert drafts[anchor - prompt_len] == expected[0], anchor
        hits = first_draft_hits(drafter, embed, head, ids, drafter.fuse_context(features[None]),
                                prompt_len)
    assert torch.equal(hits, drafts == ids[prompt_len + 1:])
    assert hits.any()  # the shipped drafter gets some of its own target's answer right


def test_trainer_samples_block_start_anchors_and_logs_the_hit_rate(tmp_path, smollm_bf16):
    from dflash_plugin.train.feature_store import OnlineFeatures
    from dflash_plugin.train.trainer import TrainConfig, Trainer

    model, tokenizer = smollm_bf16
    with (tmp_path / "responses.jsonl").open("w") as f:
        for i, (prompt, answer) in enumerate([("Count to six.", "One, two, three, four, five, six."),
                                              ("Name a color.", "Blue is a calm and cool color.")]):
            f.write(json.dumps({"id": f"s{i}", "category": "chat", "prompt": prompt,
                                "prompt_ids": encode_user_turn(tokenizer, prompt),
                                "response_ids": tokenizer(answer)["input_ids"] + [2]}) + "\n")
    online = OnlineFeatures(model, tmp_path / "responses.jsonl", [1, 8, 14, 20, 27])
    config = dict(store="", out_dir=str(tmp_path / "run"), num_draft_layers=1, block_size=8,
                  mask_token_id=16, epochs=10, anchors_per_seq=4, seqs_per_step=2,
                  max_steps=2, draft_vocab_size=2048)
    with pytest.raises(ValueError, match="anchor sampling 'hard'"):
        Trainer(TrainConfig(**config, anchor_sampling="hard"), model, online)
    Trainer(TrainConfig(**config, anchor_sampling="block-starts"), model, online).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2
    assert all(0.0 <= row["first_draft_hit"] <= 1.0 for row in rows)
