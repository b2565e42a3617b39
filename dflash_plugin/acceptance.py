"""Verification: which drafted tokens the target accepts, and the token it adds after them.

Every path keeps the target's output distribution exactly:
- greedy: accept the longest prefix of the draft that equals the target's argmax;
- sampling with a point-mass draft (DFlash drafts the argmax): the target draws its own token at
  each position and a draft token is accepted iff it equals that draw. This is Leviathan
  rejection sampling with q = one-hot(d): accept with probability p(d), else draw from the
  residual p without d, which is exactly a draw from p conditioned on not being d;
- `rejection_accept` is the general rule for a draft with full probabilities q:
  accept d with probability min(1, p(d)/q(d)); on rejection draw from norm(max(p - q, 0)).

A linear draft is a tree whose nodes each have one child, so `walk_tree` verifies both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Verdict:
    """Outcome of one verification: the accepted node path (excluding the root) and the
    target's token after it (the next bonus token)."""

    accepted_nodes: list[int]
    accepted_tokens: list[int]
    bonus_token: int

    @property
    def accept_length(self) -> int:
        """tau for this step: accepted drafts plus the bonus token."""
        return len(self.accepted_tokens) + 1


def greedy_accept(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Verdict:
    """draft_tokens [K]; target_tokens [K+1] = the target's choice after each block prefix."""
    matches = (draft_tokens == target_tokens[:-1]).int()
    n = int(torch.cumprod(matches, dim=0).sum())
    return Verdict(list(range(1, n + 1)), draft_tokens[:n].tolist(), int(target_tokens[n]))


def matching_prefix_length(drafts: list[int], truth: list[int]) -> int:
    """How many leading drafts equal the true tokens: what greedy verification accepts."""
    run = 0
    while run < min(len(drafts), len(truth)) and drafts[run] == truth[run]:
        run += 1
    return run


def walk_tree(children: list[dict[int, int]], target_tokens: torch.Tensor) -> Verdict:
    """Follow the target's choices through a draft tree.

    children[node] maps a token to the child node that drafts it (node 0 is the root, the bonus
    token); target_tokens[node] is the target's token after that node's prefix (its argmax, or
    a sample from its distribution). Tokens are drawn before the walk but only used along the
    path, so each emitted token is an exact draw from the target given the emitted prefix.
    """
    node, nodes, tokens = 0, [], []
    chosen = target_tokens.tolist()
    while chosen[node] in children[node]:
        tokens.append(chosen[node])
        node = children[node][chosen[node]]
        nodes.append(node)
    return Verdict(nodes, tokens, chosen[node])


def chain_children(num_drafts: int, draft_tokens: list[int]) -> list[dict[int, int]]:
    """Tree view of a linear draft: node i drafts draft_tokens[i-1] under node i-1."""
    return [{draft_tokens[i]: i + 1} for i in range(num_drafts)] + [{}]


def rejection_accept(draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                     target_probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Speculative sampling for a draft with full probabilities.

    draft_tokens [K], draft_probs [K, V] (the distributions they were drawn from),
    target_probs [K+1, V]. The output is distributed exactly as K+1 steps of target sampling.
    """
    k = draft_tokens.numel()
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64)
    for i in range(k):
        d = int(draft_tokens[i])
        p, q = float(target_probs[i, d]), float(draft_probs[i, d])
        if q <= 0.0 or uniforms[i] > min(1.0, p / q):
            residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
            if residual.sum() <= 0:  # p == q: any rejection is measure-zero; fall back to p
                residual = target_probs[i]
            bonus = torch.multinomial(residual / residual.sum(), 1, generator=generator)
            return Verdict(list(range(1, i + 1)), draft_tokens[:i].tolist(), int(bonus))
    bonus = torch.multinomial(target_probs[k], 1, generator=generator)
    return Verdict(list(range(1, k + 1)), draft_tokens.tolist(), int(bonus))


@dataclass
class SpecStats:
    """Per-request statistics; tau counts the bonus token."""

    accept_lengths: list[int] = field(default_factory=list)
    drafted_tokens: int = 0

    def record(self, verdict: Verdict, num_drafted: int):
        self.accept_lengths.append(verdict.accept_length)
        self.drafted_tokens += num_drafted

    @property
    def num_steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accept_lengths) - len(self.accept_lengths)
