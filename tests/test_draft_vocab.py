"""The training vocabulary kept beside a full-vocabulary drafter (dflash_plugin.draft_vocab)."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_plugin.draft_vocab import (
    DRAFT_VOCAB_FILE,
    draft_vocab_logits,
    read_draft_vocab,
    to_full_vocabulary,
    write_draft_vocab,
)
from dflash_plugin.errors import CheckpointError, MismatchError


def test_round_trip_sorts_and_deduplicates(tmp_path):
    write_draft_vocab(tmp_path, torch.tensor([7, 3, 3, 0, 11]))
    assert read_draft_vocab(tmp_path, 12).tolist() == [0, 3, 7, 11]


def test_a_folder_without_the_file_has_no_draft_vocabulary(tmp_path):
    assert read_draft_vocab(tmp_path, 100) is None


@pytest.mark.parametrize("content, error, message", [
    ("{not json", CheckpointError, "not a draft vocabulary file"),
    (json.dumps({"target_ids": [1, 2]}), CheckpointError, "not a draft vocabulary file"),
    (json.dumps({"num_ids": 3, "target_ids": [1, 2]}), CheckpointError, "expected 3 target ids"),
    (json.dumps({"num_ids": 2, "target_ids": [5, 2]}), CheckpointError, "sorted and unique"),
    (json.dumps({"num_ids": 2, "target_ids": [2, 2]}), CheckpointError, "sorted and unique"),
    (json.dumps({"num_ids": 2, "target_ids": [2, 100]}), MismatchError, "outside the target"),
    (json.dumps({"num_ids": 2, "target_ids": [-1, 2]}), MismatchError, "outside the target"),
])
def test_bad_files_are_named(tmp_path, content, error, message):
    (tmp_path / DRAFT_VOCAB_FILE).write_text(content)
    with pytest.raises(error, match=message):
        read_draft_vocab(tmp_path, 100)


def test_reduced_logits_are_the_full_heads_rows_and_minus_inf_elsewhere():
    torch.manual_seed(0)
    head = torch.randn(50, 8)
    ids = torch.tensor([1, 4, 9, 30, 49])
    hidden = torch.randn(3, 8)
    logits = to_full_vocabulary(draft_vocab_logits(hidden, head[ids]), ids, 50)
    full = hidden @ head.T
    assert logits.shape == (3, 50)
    torch.testing.assert_close(logits[:, ids], full[:, ids])
    outside = torch.ones(50, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(logits[:, outside]).all()
    assert torch.equal(logits.argmax(-1), full.masked_fill(outside, float("-inf")).argmax(-1))
    # The draft-vocabulary logits alone give the same probabilities and the same greedy token.
    small = draft_vocab_logits(hidden, head[ids].to(torch.bfloat16))
    assert small.dtype == torch.float32 and small.shape == (3, 5)
    torch.testing.assert_close(torch.softmax(small, -1),
                               torch.softmax(to_full_vocabulary(small, ids, 50), -1)[:, ids])
    assert torch.equal(ids[small.argmax(-1)], to_full_vocabulary(small, ids, 50).argmax(-1))


def test_the_shipped_drafter_loads_for_the_target_with_either_vocabulary(smollm_bf16):
    from dflash_plugin.draft_vocab import load_drafter_for_target

    target, _ = smollm_bf16
    reduced = load_drafter_for_target(target)  # "auto": the folder keeps its training vocabulary
    assert reduced.lm_head is not None and reduced.d2t.numel() < target.config.vocab_size
    rows = target.get_output_embeddings().weight.data[reduced.to_target_ids(torch.arange(5))]
    assert torch.equal(reduced.lm_head.weight.data[:5], rows)
    full = load_drafter_for_target(target, draft_vocab="full")
    assert full.lm_head is None
    with pytest.raises(ValueError, match="'auto' or 'full'"):
        load_drafter_for_target(target, draft_vocab="reduced")


def test_draft_vocab_logits_through_an_engine_matmul():
    """An engine's own kernel for x @ rows.T (vLLM's prepacked oneDNN one on CPU) gives the
    same float32 logits as torch's linear."""
    torch.manual_seed(0)
    rows = torch.randn(40, 16).to(torch.bfloat16)
    hidden = torch.randn(5, 16)
    calls = []

    def matmul(x):
        calls.append(x.dtype)
        return x @ rows.T

    ours = draft_vocab_logits(hidden, rows, matmul)
    assert calls == [torch.bfloat16] and ours.dtype == torch.float32
    assert torch.allclose(ours, draft_vocab_logits(hidden, rows), rtol=1e-2, atol=1e-2)
