"""Lookup-miss anchors (train/lookup_misses.py): lookup's accepted length per anchor on hand-made
sequences, the weights it gives, and the trainer drawing its anchors with exactly those weights
on the real target."""

import json

import pytest
import torch

from dflash_plugin.prompt_io import encode_user_turn
from dflash_plugin.train.lookup_misses import (
    MISS_BASE,
    lookup_accepted_lengths,
    lookup_miss_weights,
)


def test_accepted_length_is_lookups_right_prefix_per_anchor():
    # Anchor 7 ends "1 2", seen at 1..2: lookup drafts "3 4 5", the answer goes "3 4 7": 2 right.
    # Anchor 8 ends "1 2 3": drafts "4 5 1" against "4 7 8": 1. Elsewhere no 2-gram repeats.
    tokens = [9, 1, 2, 3, 4, 5, 1, 2, 3, 4, 7, 8]
    lengths = lookup_accepted_lengths(tokens, prompt_len=1, block_size=4)
    assert lengths.tolist() == [0, 0, 0, 0, 0, 0, 2, 1, 0, 0]


def test_accepted_length_stops_at_the_end_of_the_sequence():
    # Anchor 4 ends "5 6", seen at 0..1: lookup drafts "7 5 6", only "7" is left to check.
    lengths = lookup_accepted_lengths([5, 6, 7, 5, 6, 7], prompt_len=0, block_size=4)
    assert lengths.tolist() == [0, 0, 0, 0, 1]


def test_weights_fall_with_what_lookup_would_accept():
    weights = lookup_miss_weights(torch.tensor([0, 1, 3, 15]))
    assert weights.tolist() == pytest.approx([1.0, MISS_BASE, MISS_BASE ** 3, MISS_BASE ** 15])
    assert torch.all(weights > 0)  # every position stays drawable


def test_trainer_draws_anchors_with_lookup_miss_weights(tmp_path, smollm_bf16, monkeypatch):
    from dflash_plugin.train import trainer as trainer_module
    from dflash_plugin.train.feature_store import OnlineFeatures
    from dflash_plugin.train.trainer import TrainConfig, Trainer

    model, tokenizer = smollm_bf16
    answers = [("List the days.", "Monday, Tuesday, Wednesday. Then again: Monday, Tuesday, "
                                  "Wednesday, Thursday."),
               ("Name a color.", "Blue is a calm and cool color.")]
    with (tmp_path / "responses.jsonl").open("w") as f:
        for i, (prompt, answer) in enumerate(answers):
            f.write(json.dumps({"id": f"s{i}", "category": "chat", "prompt": prompt,
                                "prompt_ids": encode_user_turn(tokenizer, prompt),
                                "response_ids": tokenizer(answer)["input_ids"] + [2]}) + "\n")
    online = OnlineFeatures(model, tmp_path / "responses.jsonl", [1, 8, 14, 20, 27])
    drawn = []
    real_sample = trainer_module.sample_weighted_anchors

    def spy(prompt_len, weights, num_anchors, generator):
        drawn.append((prompt_len, weights.clone()))
        return real_sample(prompt_len, weights, num_anchors, generator)

    monkeypatch.setattr(trainer_module, "sample_weighted_anchors", spy)
    config = dict(store="", out_dir=str(tmp_path / "run"), num_draft_layers=1, block_size=8,
                  mask_token_id=16, epochs=10, anchors_per_seq=4, seqs_per_step=2,
                  max_steps=2, draft_vocab_size=2048, anchor_sampling="lookup-misses")
    Trainer(TrainConfig(**config), model, online).run()
    assert len(drawn) == 4  # two steps of two sequences
    expected = [lookup_accepted_lengths(seq.input_ids, seq.prompt_len, 8)
                for seq in online.sequences]
    for prompt_len, weights in drawn:
        assert any(torch.equal(weights, lookup_miss_weights(accepted)) for accepted in expected)
    # the repeated list gave lookup something to accept there, so the weights are not uniform
    assert any(bool((accepted > 0).any()) for accepted in expected)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2 and all(0.0 < row["lookup_miss"] <= 1.0 for row in rows)
