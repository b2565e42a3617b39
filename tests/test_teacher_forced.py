"""Teacher-forced acceptance predicts decoding: on the target's own greedy answer, the block
the drafter writes at each position decoding anchored a block on is accepted exactly as far as
speculative decoding accepted it (real SmolLM2, shipped drafter, float32)."""

from __future__ import annotations

import pytest
import torch

from dflash_plugin.features import FeatureCapture
from dflash_plugin.generate import SpecDecoder
from dflash_plugin.train.feature_store import target_features
from dflash_plugin.train.teacher_forced import (
    answer_sequences,
    block_acceptance,
    block_candidates,
    confidence_table,
    decoded_tau,
    ngram_acceptance,
    target_confidence,
    teacher_forced_tau,
    tree_acceptance,
    with_pass_length,
)
from core_helpers import EOS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("positions", [None, 5])
def test_teacher_forced_acceptance_matches_decoding(target_f32, shipped_drafter_f32,
                                                    chat_prompts, positions):
    """Also for a draft pass shorter than the trained block (`with_pass_length`): what
    decoding with that many positions a pass accepts."""
    drafter = shipped_drafter_f32
    if positions is not None:
        drafter = with_pass_length(drafter, positions)
        assert drafter.block_size == positions and shipped_drafter_f32.block_size == 16
        assert drafter.fc is shipped_drafter_f32.fc  # the same weights
    matched = compared = 0
    new_tokens = 48
    for prompt in chat_prompts[:3]:
        out = (SpecDecoder(target_f32, drafter, block_size=drafter.block_size)
               .generate(prompt, new_tokens, stop_token_ids={EOS}))
        ids = prompt[0].tolist() + out.token_ids
        prompt_len = prompt.shape[1]
        capture = FeatureCapture(target_f32, drafter.fields.target_layer_ids)
        with capture.active():
            feats = target_features(target_f32, capture, ids, torch.float32)
        accepted = block_acceptance(drafter, target_f32.get_input_embeddings(),
                                    target_f32.get_output_embeddings(), feats, ids, prompt_len)
        assert accepted.numel() == len(out.token_ids) - 1
        assert int(accepted.max()) <= drafter.block_size
        anchor = 0  # answer position of the bonus token each decoding step drafted after
        for step_accepted in out.stats.accept_lengths[:-1]:  # the last is cut by the length
            # Near the length limit decoding drafts a shorter block, whose masks the drafter
            # attends to: other drafts than the full block's. Compare full blocks only.
            if new_tokens - anchor >= drafter.block_size:
                compared += 1
                matched += int(accepted[anchor]) == step_accepted
            anchor += step_accepted
    assert compared >= 10
    assert matched == compared


def test_replayed_tree_acceptance_matches_tree_decoding(target_f32, tokenizer,
                                                       shipped_drafter_f32, chat_prompts):
    """The same for a draft tree with the lookup branch (what tools/draft_shapes.py replays):
    built from one teacher-forced pass, it accepts at every anchor what decoding accepted."""
    import numpy as np

    from dflash_plugin.lookup_tree import LookupTreeDecoder, graft
    from dflash_plugin.ngram import lookup_continuation
    from dflash_plugin.prompt_io import encode_user_turn
    from dflash_plugin.tree import build_tree

    copying = torch.tensor([encode_user_turn(tokenizer, "Repeat this sentence exactly three "
                                             "times: The old river bank is quiet at night.")])
    drafter, budget, compared, lookup_rounds = shipped_drafter_f32, 8, 0, 0
    for prompt in [*chat_prompts[:2], copying]:
        decoder = LookupTreeDecoder(target_f32, drafter, budget)
        out = decoder.generate(prompt, 48, stop_token_ids={EOS})
        ids = prompt[0].tolist() + out.token_ids
        prompt_len = prompt.shape[1]
        capture = FeatureCapture(target_f32, drafter.fields.target_layer_ids)
        with capture.active():
            feats = target_features(target_f32, capture, ids, torch.float32)
        log_probs, top_ids = block_candidates(drafter, target_f32.get_input_embeddings(),
                                              target_f32.get_output_embeddings(), feats, ids,
                                              prompt_len, budget)
        tokens = np.asarray(ids)
        replayed = []
        for i, anchor in enumerate(range(prompt_len, len(ids) - 1)):
            tree = graft(build_tree(0, log_probs[i], top_ids[i], budget),
                         lookup_continuation(tokens[:anchor + 1], drafter.block_size - 1))
            replayed.append(tree_acceptance(tree, tokens[anchor + 1:anchor + drafter.block_size]))
        anchor = 0
        for step_accepted in out.stats.accept_lengths[:-1]:  # the last is cut by the length
            assert replayed[anchor] == step_accepted, anchor
            compared += 1
            anchor += step_accepted
        lookup_rounds += decoder.lookup_rounds
    assert compared >= 8 and lookup_rounds > 0


def test_tree_acceptance_follows_the_truth_through_the_tree():
    from dflash_plugin.lookup_tree import two_branch_tree

    tree = two_branch_tree(0, [[5, 6, 7], [5, 8]])
    assert tree_acceptance(tree, [5, 8, 1]) == 3   # second branch, then its bonus
    assert tree_acceptance(tree, [5, 6]) == 3      # the truth ends before the branch does
    assert tree_acceptance(tree, [9, 5]) == 1


def test_decoded_tau_replays_blocks_from_the_start():
    # accepted lengths per position: blocks start at 0 (3 tokens), 3 (1), 4 (4): 8 in 3 passes
    assert decoded_tau([3, 9, 9, 1, 4, 9, 9, 9]) == pytest.approx(8 / 3)
    assert decoded_tau([1] * 5) == 1.0 and decoded_tau([]) == 0.0


def test_teacher_forced_tau_pools_blocks_and_checks_input(target_f32, shipped_drafter_f32):
    records = [{"prompt_ids": [1, 9, 4, 5], "response_ids": list(range(20, 40))},
               {"prompt_ids": [1, 7], "response_ids": [30]}]       # too short: skipped
    seqs = answer_sequences(records, answer_tokens=12)
    assert seqs == [([1, 9, 4, 5] + list(range(20, 32)), 4)]
    res = teacher_forced_tau(target_f32, {"a": shipped_drafter_f32, "b": shipped_drafter_f32},
                             seqs)
    assert res["a"]["blocks"] == 11 and res["a"] == res["b"]
    assert sum(res["a"]["accepted_lengths"]) == 11 and len(res["a"]["accepted_lengths"]) == 16
    hist = res["a"]["accepted_lengths"]
    assert sum((k + 1) * c for k, c in enumerate(hist)) / 11 == pytest.approx(res["a"]["tau"],
                                                                             abs=1e-4)
    assert 1.0 <= res["a"]["tau"] <= 16.0
    with pytest.raises(ValueError):
        teacher_forced_tau(target_f32, {"a": shipped_drafter_f32}, [])


def test_ngram_acceptance_follows_prompt_lookup():
    # prompt 1 2 | answer 5 6 7 5 6 7 5 9: from the second "5 6" on, lookup copies "7 5 6 7..."
    ids = [1, 2, 5, 6, 7, 5, 6, 7, 5, 9]
    got = ngram_acceptance(ids, prompt_len=2, block_size=4).tolist()
    # anchors at positions 2..8: no earlier bigram until "5 6" recurs at position 6
    assert got == [1, 1, 1, 1, 3, 2, 1]


def test_teacher_forced_tau_with_ngram_takes_the_better_per_anchor(target_f32,
                                                                    shipped_drafter_f32):
    seqs = [([1, 9, 4, 5] + [20, 21, 22, 23] * 4, 4)]
    res = teacher_forced_tau(target_f32, {"a": shipped_drafter_f32}, seqs, ngram=True)
    assert set(res) == {"a", "ngram", "a|ngram"}
    assert res["a|ngram"]["tau"] >= max(res["a"]["tau"], res["ngram"]["tau"])
    assert res["ngram"]["tau"] > 3  # a repeating answer is copied once it has repeated


def test_confidence_table_buckets_first_tokens_by_the_targets_confidence():
    confidence = torch.tensor([0.1, 0.29, 0.3, 0.95, 0.99, 1.0])
    right = torch.tensor([False, True, True, False, True, True])
    table = confidence_table(confidence, right)
    assert list(table) == ["0.0-0.3", "0.3-0.5", "0.5-0.7", "0.7-0.9", "0.9-0.99", "0.99-1.0"]
    assert table["0.0-0.3"] == {"share": round(2 / 6, 4), "first_right": 0.5}
    assert table["0.3-0.5"] == {"share": round(1 / 6, 4), "first_right": 1.0}  # from 0.3 on
    assert table["0.5-0.7"] == {"share": 0.0, "first_right": None}
    assert table["0.9-0.99"]["first_right"] == 0.0
    assert table["0.99-1.0"] == {"share": round(2 / 6, 4), "first_right": 1.0}


def test_target_confidence_of_its_own_greedy_answer_is_its_top_probability(target_f32,
                                                                           shipped_drafter_f32,
                                                                           chat_prompts):
    prompt = chat_prompts[0]
    out = SpecDecoder(target_f32, shipped_drafter_f32).generate(prompt, 12, stop_token_ids={EOS})
    ids, prompt_len = prompt[0].tolist() + out.token_ids, prompt.shape[1]
    confidence = target_confidence(target_f32, ids, prompt_len)
    with torch.no_grad():
        probs = target_f32(torch.tensor([ids])).logits[0, prompt_len:-1].float().softmax(-1)
    assert confidence.shape == (len(ids) - 1 - prompt_len,)
    torch.testing.assert_close(confidence, probs.max(-1).values)  # greedy: its top token
    res = teacher_forced_tau(target_f32, {"a": shipped_drafter_f32}, [(ids, prompt_len)],
                             by_confidence=True)
    table = res["a"]["first_token_by_target_confidence"]
    assert sum(b["share"] for b in table.values()) == pytest.approx(1.0, abs=1e-3)
    first_right = sum(c for c in res["a"]["accepted_lengths"][1:]) / res["a"]["blocks"]
    pooled = sum(b["share"] * b["first_right"] for b in table.values() if b["share"])
    assert pooled == pytest.approx(first_right, abs=1e-3)


def test_a_pass_length_outside_the_trained_block_is_refused(shipped_drafter_f32):
    for positions in (1, 17):
        with pytest.raises(ValueError, match="2..16 positions"):
            with_pass_length(shipped_drafter_f32, positions)
