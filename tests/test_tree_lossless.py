"""DDTree on the real target (SmolLM2-135M-Instruct, float32) is lossless: token-identical to
plain greedy decoding, and at T=1 distributed exactly as the target's own sampling."""

import copy
import json
import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from transformers import DynamicCache

from dflash_plugin import kv_cache
from dflash_plugin.checkpoint import save_drafter
from dflash_cli.main import main as cli_main
from dflash_plugin.config import make_config
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.generate import generate_plain
from dflash_plugin.prompt_io import encode_user_turn
from dflash_plugin.sampling import SamplingParams, target_probs
from dflash_plugin.tree import build_tree, top_candidates
from dflash_plugin.tree_decode import TreeDecoder

pytestmark = pytest.mark.slow

EOS = 2
MAX_NEW = 16  # references and oracle runs
SHORT = 8  # random-drafter runs: about one token per (costly) tree pass
PROMPTS = [
    "Write a haiku about autumn.",
    "What is 17 times 23?",
    "Answer with one word: what color is grass?",
    "Translate 'good morning' into French.",
    "List three primary colors.",
    "def fibonacci(n):",
    "Explain why the sky is blue in one sentence.",
    "Give me a name for a pet turtle.",
]


@pytest.fixture(scope="module")
def model(smollm_f32):
    return smollm_f32  # (target, tokenizer), loaded once per session by conftest.py


def random_drafter(target, seed=0, **extra):
    torch.manual_seed(seed)
    config = make_config(target.config, num_draft_layers=2, block_size=16, mask_token_id=3, **extra)
    return DFlashDraftModel(config).eval()


@pytest.fixture(scope="module")
def drafter(model):
    return random_drafter(model[0])


def chat_ids(tokenizer, text):
    return torch.tensor([encode_user_turn(tokenizer, text)])


@pytest.fixture(scope="module")
def references(model):
    target, tokenizer = model
    return [generate_plain(target, chat_ids(tokenizer, p), MAX_NEW, stop_token_ids={EOS})
            for p in PROMPTS]


@pytest.mark.parametrize("budget", [4, 16, 48])
def test_greedy_matches_plain_decoding(model, drafter, references, budget):
    target, tokenizer = model
    decoder = TreeDecoder(target, drafter, budget=budget)
    for prompt, ref in zip(PROMPTS, references):
        out = decoder.generate(chat_ids(tokenizer, prompt), SHORT, stop_token_ids={EOS})
        expected = ref.token_ids[:SHORT]  # greedy: a shorter run is a prefix of a longer one
        assert out.token_ids == expected, prompt
        assert out.finish_reason == ("stop" if expected[-1] == EOS else "length")
        assert out.stats.num_steps == out.num_target_passes - 1
        assert out.stats.drafted_tokens <= budget * out.stats.num_steps
    assert any(EOS in r.token_ids[:SHORT] for r in references)  # EOS is exercised too


class OracleTreeDecoder(TreeDecoder):
    """Draft log-probs that put the true continuation in the tree, but at depths 1 and 4 a
    decoy outranks it, so the true path is not the first-popped branch and its nodes are not
    contiguous: KV compaction must reorder."""

    def __init__(self, target, drafter, budget, reference, prompt_len):
        super().__init__(target, drafter, budget=budget)
        self.reference, self.prompt_len = reference, prompt_len
        self.paths = []

    def draft_logits(self, bonus, start, context, cache, block):
        logits = super().draft_logits(bonus, start, context, cache, block)  # keeps the draft cache in step
        log_probs = torch.full_like(logits, -30.0)
        for d in range(1, block):
            index = start - self.prompt_len + d
            true = self.reference[index] if index < len(self.reference) else 0
            decoy = (true + 1) % logits.shape[-1]
            p_true, p_decoy = (0.4, 0.55) if d in (1, 4) else (0.8, 0.15)
            log_probs[d - 1, true], log_probs[d - 1, decoy] = math.log(p_true), math.log(p_decoy)
        return log_probs

    def speculate(self, *args):
        verdict, features, drafted = super().speculate(*args)
        self.paths.append(verdict.accepted_nodes)
        return verdict, features, drafted


@pytest.mark.parametrize("budget", [16, 48])
def test_oracle_tree_accepts_many_tokens_through_reordered_nodes(model, drafter, references, budget):
    target, tokenizer = model
    for prompt, ref in list(zip(PROMPTS, references))[:3]:
        ids = chat_ids(tokenizer, prompt)
        decoder = OracleTreeDecoder(target, drafter, budget, ref.token_ids, ids.shape[1])
        out = decoder.generate(ids, MAX_NEW, stop_token_ids={EOS})
        assert out.token_ids == ref.token_ids, prompt
        assert out.stats.mean_accept_length > 2.5
        assert any(p != list(range(1, len(p) + 1)) for p in decoder.paths)  # non-contiguous


def test_tree_verify_matches_causal_passes_and_compaction(model, drafter):
    """Each node's logits equal a causal pass over prefix + its path; after compaction the cache
    equals the cache of a causal pass over prefix + the kept path."""
    target, tokenizer = model
    decoder = TreeDecoder(target, drafter, budget=10)
    prefix = chat_ids(tokenizer, PROMPTS[0])
    start = prefix.shape[1]
    g = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(4, 6, generator=g), dim=-1)
    values, ids = top_candidates(log_probs, 10)
    tree = build_tree(510, values, ids + 1000, 10)
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        target(prefix, past_key_values=cache, use_cache=True)
        logits = decoder.verify(tree, start, cache)
        paths = [[0]]
        for node in range(1, tree.num_nodes):
            paths.append(paths[tree.parents[node]] + [node])
        for node, path in enumerate(paths):
            seq = torch.cat([prefix, torch.tensor([[tree.tokens[i] for i in path]])], dim=1)
            expected = target(seq).logits[0, -1]
            torch.testing.assert_close(logits[node], expected, atol=2e-4, rtol=1e-4)
        kept = max(paths, key=lambda p: (len(p), p[-1]))
        assert kept != list(range(len(kept)))
        kv_cache.keep_positions(cache, start, [start + i for i in kept])
        fresh = DynamicCache(config=target.config)
        target(torch.cat([prefix, torch.tensor([[tree.tokens[i] for i in kept]])], dim=1),
               past_key_values=fresh, use_cache=True)
    assert cache.get_seq_length() == start + len(kept)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-4, rtol=1e-4)


def test_reduced_draft_vocabulary(model, references):
    target, tokenizer = model
    vocab = 512
    drafter = random_drafter(target, seed=1, draft_vocab_size=vocab)
    target_ids = torch.sort(torch.randperm(target.config.vocab_size,
                                           generator=torch.Generator().manual_seed(0))[:vocab]).values
    drafter.d2t.copy_(target_ids - torch.arange(vocab))
    decoder = TreeDecoder(target, drafter, budget=8)
    tree = decoder.draft_tree(5, 0, torch.zeros(1, 0, target.config.hidden_size),
                              drafter.new_cache(), block=4)
    assert set(tree.tokens[1:]) <= set(target_ids.tolist())
    out = decoder.generate(chat_ids(tokenizer, PROMPTS[1]), MAX_NEW, stop_token_ids={EOS})
    assert out.token_ids == references[1].token_ids


def test_cli_dispatches_to_ddtree(model, drafter, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("dflash_plugin.target.load_target", lambda path, dtype: model)
    save_drafter(drafter, tmp_path / "draft", dtype=torch.float32)
    code = cli_main(["generate", "--prompt", PROMPTS[3], "--draft", str(tmp_path / "draft"),
                     "--speculative-algorithm", "ddtree", "--tree-budget", "8", "--dtype", "float32",
                     "--max-new-tokens", "8", "--compare"])
    assert code == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["identical_to_baseline"] and len(row["token_ids"]) == 8
    with pytest.raises(SystemExit):
        cli_main(["generate", "--prompt", "x", "--speculative-algorithm", "tree"])
    assert cli_main(["generate", "--prompt", "x", "--draft", str(tmp_path / "draft"), "--dtype",
                     "float32", "--speculative-algorithm", "DDTREE", "--tree-budget", "0"]) == 2


SAMPLING = SamplingParams(temperature=1.0, top_k=3)  # top-k keeps the exact law small


def round_law(target, base: list[int], tree) -> dict[tuple[int, ...], float]:
    """Exact law of one round's output (accepted tokens + bonus) if the target simply samples
    token after token and stops at the first token that leaves the tree."""
    law, stack = {}, [(0, (), 1.0)]
    while stack:
        node, seq, p = stack.pop()
        probs = target_probs(target(torch.tensor([base + list(seq)])).logits[0, -1], SAMPLING)
        for token in torch.nonzero(probs).flatten().tolist():
            child, q = tree.children[node].get(token), p * float(probs[token])
            if child is None:
                law[seq + (token,)] = q
            else:
                stack.append((child, seq + (token,), q))
    return law


class RankedDecoder(TreeDecoder):
    """Proposes two fixed tokens per depth at probabilities 0.6 / 0.4 (no drafter pass): with
    budget 3 the tree is {a1, a2, a1->b1}, so a round can stop at the root, after a1 or a2, or
    after accepting a1 and b1."""

    def __init__(self, target, drafter, proposals):
        super().__init__(target, drafter, budget=3)
        self.proposals = proposals  # per depth: [first, second]

    def draft_logits(self, bonus, start, context, cache, block):
        log_probs = torch.full((block - 1, self.lm_head.out_features), -30.0)
        for d, (first, second) in enumerate(self.proposals[: block - 1]):
            log_probs[d, first], log_probs[d, second] = math.log(0.6), math.log(0.4)
        return log_probs


def chi_square_pvalue(counts: dict, law: dict, runs: int) -> float:
    outcomes = sorted(law, key=law.get, reverse=True)
    total = sum(law.values())  # 1 up to float32 rounding, which scipy's sum check would refuse
    observed = [counts[s] for s in outcomes]
    expected = [runs * law[s] / total for s in outcomes]
    while expected[-1] < 5:  # pool rare outcomes so the chi-square approximation holds
        observed[-2:] = [sum(observed[-2:])]
        expected[-2:] = [sum(expected[-2:])]
    return chisquare(observed, expected).pvalue


def round_outputs(decoder, target, prompt: list[int], bonus: int, runs: int,
                  before_round=lambda: None) -> Counter:
    """Outputs (accepted tokens + bonus) of `runs` seeded 3-token rounds, each from the same
    prefilled cache (SAMPLING); `before_round` resets any per-request state of the decoder."""
    prefilled = DynamicCache(config=target.config)
    target(torch.tensor([prompt]), past_key_values=prefilled, use_cache=True)
    counts = Counter()
    with decoder.capture.active():
        for seed in range(runs):
            before_round()
            caches = (copy.deepcopy(prefilled), None)
            verdict, _, _ = decoder.speculate(bonus, len(prompt), None, caches, 3, SAMPLING,
                                              torch.Generator().manual_seed(seed))
            counts[tuple(verdict.accepted_tokens + [verdict.bonus_token])] += 1
    return counts


def test_tree_round_at_t1_samples_the_target_distribution(model, drafter):
    """Many rounds from one prefilled state (a round costs one target pass, a whole request
    three) against the exact law of the round's output."""
    target, tokenizer = model
    prompt = tokenizer("My favourite fruit is")["input_ids"]
    start = len(prompt)
    top2 = lambda seq: torch.topk(target(torch.tensor([prompt + seq])).logits[0, -1], 2).indices.tolist()  # noqa: E731
    with torch.inference_mode():
        bonus = top2([])[0]
        a1, a2 = top2([bonus])
        decoder = RankedDecoder(target, drafter, [[a1, a2], top2([bonus, a1])])
        tree = decoder.draft_tree(bonus, start, None, None, block=3)
        assert tree.depths == [0, 1, 1, 2] and tree.parents == [-1, 0, 0, 1]
        law = round_law(target, prompt + [bonus], tree)
        runs = 200
        counts = round_outputs(decoder, target, prompt, bonus, runs)
    assert set(counts) <= set(law), "outputs outside the target's support"
    assert chi_square_pvalue(counts, law, runs) > 1e-3
    assert sum(counts[s] for s in law if len(s) == 3) > runs // 10  # accepted two deep


def test_sampled_generation_runs_and_is_seeded(model, drafter):
    target, tokenizer = model
    decoder = TreeDecoder(target, drafter, budget=8)
    sampling = SamplingParams(temperature=0.8, top_p=0.9)
    ids = chat_ids(tokenizer, PROMPTS[0])
    first, again = (decoder.generate(ids, 6, sampling, seed=3) for _ in range(2))
    assert first.token_ids == again.token_ids and len(first.token_ids) == 6
