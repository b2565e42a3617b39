"""Test helpers shared by the core tests (imported as `core_helpers`: a bare `conftest` import
would resolve to whichever of the several conftest.py files was loaded first): the prompts and
special tokens, drafter and tiny-target builders, decoders with scripted drafts, exact
enumeration of a target's sampling distribution, and a chi-square goodness-of-fit."""

from __future__ import annotations

from collections import Counter

import torch
from scipy import stats

from dflash_plugin.config import make_config
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.generate import SpecDecoder
from dflash_plugin.sampling import SamplingParams, target_probs

EOS = 2  # <|im_end|> of SmolLM2-Instruct
PLAIN_MAX_NEW = 48  # new tokens of the shared plain greedy references (conftest.plain_results)
MASK = 3  # <repo_name>: a special token a chat never produces

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 10.",
    "Translate 'good morning' into Spanish and German.",
    "Write a Python function that returns the square of a number.",
    "Why is the sky blue?",
    "Give me a short tip for staying focused while studying.",
]


def make_drafter(target, *, block_size: int = 16, seed: int = 0, num_draft_layers: int = 2,
                 mask_token_id: int = MASK, dtype: torch.dtype | None = None) -> DFlashDraftModel:
    torch.manual_seed(seed)
    config = make_config(target.config, num_draft_layers=num_draft_layers, block_size=block_size,
                         mask_token_id=mask_token_id)
    return DFlashDraftModel(config).to(dtype or target.dtype).eval()


def tiny_llama(seed: int = 0, vocab_size: int = 16, logit_scale: float = 1.0):
    """A 4-layer random Llama with a small vocabulary. logit_scale sharpens its distributions
    (random init gives near-uniform ones)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=1, pad_token_id=None)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


class ProposingDecoder(SpecDecoder):
    """A SpecDecoder whose drafts come from `propose(generated_so_far) -> token`.

    The real drafter still runs every round (so its context cache is exercised); only its
    proposals are replaced. `rounds` records, per draft call, the committed tokens before the
    bonus, the bonus, and the proposals.
    """

    def __init__(self, target, drafter, block_size, prompt_len, propose):
        super().__init__(target, drafter, block_size=block_size)
        self.prompt_len = prompt_len
        self.propose = propose
        self._last: list[int] = []
        self.rounds: list[tuple[list[int], int, list[int]]] = []

    def draft(self, bonus, start, context, cache, block, num_drafts=None):
        num_drafts = block - 1 if num_drafts is None else num_drafts
        real = super().draft(bonus, start, context, cache, block, num_drafts)
        assert real.shape == (num_drafts,)
        committed_len = start - self.prompt_len
        if committed_len == 0:
            self._last = []
        # Committed tokens are the previous round's sequence up to the new bonus: the accepted
        # drafts are a prefix of what we proposed last round.
        committed = self._last[:committed_len]
        assert len(committed) == committed_len
        seq = committed + [bonus]
        proposals = []
        for _ in range(num_drafts):
            token = int(self.propose(seq))
            proposals.append(token)
            seq.append(token)
        self._last = seq
        self.rounds.append((committed, bonus, proposals))
        return torch.tensor(proposals, dtype=torch.long)


@torch.inference_mode()
def next_token_probs(target, prompt: list[int], prefixes: list[list[int]],
                     sampling: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution [len(prefixes), V] after prompt + each prefix
    (all prefixes the same length), in one batched pass."""
    ids = torch.tensor([prompt + list(p) for p in prefixes])
    return target_probs(target(ids).logits[:, -1], sampling)


def exact_joint(target, prompt: list[int], num_tokens: int,
                sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """Exact probability of every sequence of `num_tokens` sampled tokens (finite support thanks
    to top-k/top-p), by enumeration."""
    joint = {(): 1.0}
    for _ in range(num_tokens):
        prefixes = list(joint)
        probs = next_token_probs(target, prompt, [list(p) for p in prefixes], sampling).double()
        nxt = {}
        for prefix, row in zip(prefixes, probs):
            for token in torch.nonzero(row).flatten().tolist():
                nxt[prefix + (token,)] = joint[prefix] * float(row[token])
        joint = nxt
    return joint


def chi_square_pvalue(samples: list[tuple], probs: dict[tuple, float], min_expected: float = 5.0):
    """Pearson chi-square of the samples against exact cell probabilities. Cells with fewer than
    min_expected expected counts are pooled into one. A sample outside the support gives 0."""
    n = len(samples)
    counts = Counter(samples)
    if any(probs.get(c, 0.0) <= 0.0 for c in counts):
        return 0.0  # a sample the target cannot produce
    big = [c for c, p in probs.items() if p * n >= min_expected]
    observed = [counts[c] for c in big]
    expected = [probs[c] * n for c in big]
    rest_obs = n - sum(observed)
    rest_exp = n - sum(expected)
    if rest_exp > 0:
        observed.append(rest_obs)
        expected.append(rest_exp)
    expected = [e * n / sum(expected) for e in expected]  # remove float drift
    return float(stats.chisquare(observed, expected).pvalue)
