"""Draft trees with a prompt-lookup branch on the reference path: greedy output equal to plain
decoding on the real target, the lookup branch accepted where the answer copies, and a round at
T=1 drawing the target's distribution."""

from __future__ import annotations

import pytest
import torch

from dflash_plugin.datastore import AnswerDatastore
from dflash_plugin.generate import SpecDecoder, generate_plain
from dflash_plugin.lookup_tree import LookupTreeDecoder, graft, two_branch_tree
from dflash_plugin.tree import build_tree
from dflash_plugin.prompt_io import encode_user_turn
from core_helpers import EOS, PLAIN_MAX_NEW

pytestmark = pytest.mark.slow


def test_two_branch_tree_shares_a_common_prefix():
    tree = two_branch_tree(7, [[1, 2, 3], [1, 5], []])
    assert tree.tokens == [7, 1, 2, 3, 5]
    assert tree.parents == [-1, 0, 1, 2, 1]
    assert tree.depths == [0, 1, 2, 3, 2]
    assert tree.children == [{1: 1}, {2: 2, 5: 4}, {3: 3}, {}, {}]


def test_graft_reuses_the_drafter_tree_where_the_lookup_agrees():
    # depth 1: tokens 4 (p .6), 5 (.4); depth 2: token 6 (p 1.0)
    log_probs = torch.tensor([[0.6, 0.4], [1.0, 1e-9]]).log()
    ids = torch.tensor([[4, 5], [6, 7]])
    tree = build_tree(9, log_probs, ids, budget=3)
    assert tree.tokens == [9, 4, 6, 5]
    graft(tree, [4, 6, 8])
    assert tree.tokens == [9, 4, 6, 5, 8] and tree.parents[-1] == 2 and tree.depths[-1] == 3
    graft(tree, [4, 6])
    assert tree.num_nodes == 5


@pytest.mark.parametrize("budget", [1, 16])
def test_greedy_output_equals_plain_decoding(target_f32, shipped_drafter_f32, chat_prompts,
                                             plain_results, budget):
    decoder = LookupTreeDecoder(target_f32, shipped_drafter_f32, budget)
    for i in range(3):
        out = decoder.generate(chat_prompts[i], PLAIN_MAX_NEW, stop_token_ids={EOS})
        assert out.token_ids == plain_results(i).token_ids, i


def test_lookup_branch_wins_where_the_answer_copies(target_f32, tokenizer, shipped_drafter_f32):
    text = ("Repeat this sentence exactly three times: The quick brown fox jumps over the lazy "
            "dog near the old river bank.")
    ids = torch.tensor([encode_user_turn(tokenizer, text)])
    plain = generate_plain(target_f32, ids, 64, stop_token_ids={EOS})
    chain = SpecDecoder(target_f32, shipped_drafter_f32).generate(ids, 64, stop_token_ids={EOS})
    decoder = LookupTreeDecoder(target_f32, shipped_drafter_f32, budget=4)
    both = decoder.generate(ids, 64, stop_token_ids={EOS})
    assert both.token_ids == plain.token_ids == chain.token_ids
    assert decoder.lookup_wins >= 1
    assert both.num_target_passes < chain.num_target_passes


def test_retrieved_branch_keeps_greedy_output_and_wins_where_the_answers_know(
        target_f32, shipped_drafter_f32, chat_prompts, plain_results):
    answers = [plain_results(i).token_ids for i in range(3)]
    budget = 2
    # One datastore holds these very answers; the other holds them with every fourth token
    # changed, so its n-grams still match but its continuations go wrong within a few tokens.
    spoilt = [[t + 1 if k % 4 == 0 else t for k, t in enumerate(a)] for a in answers]
    decoders = {"lookup only": LookupTreeDecoder(target_f32, shipped_drafter_f32, budget),
                "knows": LookupTreeDecoder(target_f32, shipped_drafter_f32, budget,
                                           datastore=AnswerDatastore.build(answers)),
                "spoilt": LookupTreeDecoder(target_f32, shipped_drafter_f32, budget,
                                            datastore=AnswerDatastore.build(spoilt))}
    passes = dict.fromkeys(decoders, 0)
    for i in range(3):
        for name, decoder in decoders.items():
            out = decoder.generate(chat_prompts[i], PLAIN_MAX_NEW, stop_token_ids={EOS})
            assert out.token_ids == answers[i], (name, i)
            passes[name] += out.num_target_passes
    assert decoders["knows"].retrieved_rounds > 0 and decoders["spoilt"].retrieved_rounds > 0
    assert decoders["knows"].retrieved_wins > 0
    assert passes["knows"] < passes["lookup only"]


def test_a_round_at_t1_samples_the_target_distribution(smollm_f32, shipped_drafter_f32):
    """A round with a drafter branch a1 -> b1 and a lookup branch a2 from one prefilled state,
    many seeds, against the exact law of the round's output (tests/test_tree_lossless.py's
    check)."""
    from test_tree_lossless import chi_square_pvalue, round_law, round_outputs

    target, tokenizer = smollm_f32
    prompt = tokenizer("My favourite fruit is")["input_ids"]
    start = len(prompt)
    top2 = lambda seq: torch.topk(target(torch.tensor([prompt + seq])).logits[0, -1],  # noqa: E731
                                  2).indices.tolist()
    with torch.inference_mode():
        bonus = top2([])[0]
        a1, a2 = top2([bonus])
        b1 = top2([bonus, a1])[0]

        class Fixed(LookupTreeDecoder):
            def draft_tree(self, bonus, start, context, cache, block):
                self._drafter_nodes = 3
                self.lookup_rounds += 1
                return two_branch_tree(bonus, [[a1, b1], [a2]])

        decoder = Fixed(target, shipped_drafter_f32, budget=2)
        tree = two_branch_tree(bonus, [[a1, b1], [a2]])
        law = round_law(target, prompt + [bonus], tree)
        runs = 200
        counts = round_outputs(decoder, target, prompt, bonus, runs,
                               before_round=lambda: setattr(decoder, "_history", list(prompt)))
    assert set(counts) <= set(law), "outputs outside the target's support"
    assert chi_square_pvalue(counts, law, runs) > 1e-3
    assert decoder.lookup_wins > 0 and decoder.lookup_rounds == runs


def test_cli_generate_runs_the_lookup_tree(smollm_f32, monkeypatch, capsys):
    import json

    from dflash_cli.main import main as cli_main

    monkeypatch.setattr("dflash_plugin.target.load_target", lambda path, dtype: smollm_f32)
    code = cli_main(["generate", "--prompt", "Say 'one two three' twice.", "--dtype", "float32",
                     "--speculative-algorithm", "lookup_tree", "--tree-budget", "8",
                     "--max-new-tokens", "24", "--compare"])
    assert code == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["identical_to_baseline"] and 1 <= len(row["token_ids"]) <= 24
