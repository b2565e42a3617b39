"""Anchors drawn where prompt lookup fails (not in the paper, which draws them uniformly).

Served, the drafter's chain is verified beside the n-gram lookup's: the vLLM plugin picks the
better of the two per request and step (`ngram.py`), and draft trees graft the lookup branch on
(`lookup_tree.py`). A block where lookup's continuation would accept L tokens gains from the
drafter only when the drafter gets L + 1 of them right, a chance that falls about geometrically
in L; where lookup finds nothing (L = 0) every token the drafter gets right counts. So anchors
are drawn with weight `base ** L`, spending the drafter's capacity where lookup does not already
draft (docs/history.md, "Anchors where lookup fails").
"""

from __future__ import annotations

import numpy as np
import torch

from dflash_plugin.ngram import lookup_continuation

# Weight per token lookup would accept at an anchor; about the drafter's per-token acceptance
# on real prompts (tau ~1.8 teacher-forced: roughly one right token in two).
MISS_BASE = 0.5


def lookup_accepted_lengths(input_ids, prompt_len: int, block_size: int) -> torch.Tensor:
    """[seq_len - 1 - prompt_len] for each anchor candidate a (prompt_len .. seq_len - 2): how
    many tokens of lookup's continuation of tokens[:a + 1] equal the sequence's next tokens,
    i.e. what lookup would have had accepted in a block anchored at a (at most block_size - 1)."""
    tokens = np.asarray(input_ids)
    lengths = []
    for anchor in range(prompt_len, tokens.shape[0] - 1):
        hint = lookup_continuation(tokens[:anchor + 1], block_size - 1)
        truth = tokens[anchor + 1:anchor + 1 + len(hint)]
        wrong = np.flatnonzero(np.asarray(hint[:truth.shape[0]]) != truth)
        lengths.append(int(wrong[0]) if wrong.size else truth.shape[0])
    return torch.tensor(lengths, dtype=torch.long)


def lookup_miss_weights(accepted: torch.Tensor, base: float = MISS_BASE) -> torch.Tensor:
    """Sampling weight per anchor candidate: `base` to the power of lookup's accepted length."""
    return torch.pow(torch.tensor(base, dtype=torch.float64), accepted.double()).float()
