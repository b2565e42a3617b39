"""Unit tests of dflash_plugin/acceptance.py on synthetic tensors."""

import itertools

import pytest
import torch
from core_helpers import chi_square_pvalue

from dflash_plugin.acceptance import (
    SpecStats,
    Verdict,
    chain_children,
    greedy_accept,
    matching_prefix_length,
    rejection_accept,
    walk_tree,
)


def t(*xs):
    return torch.tensor(xs, dtype=torch.long)


# ---- greedy_accept --------------------------------------------------------------------------

def test_greedy_all_rejected():
    v = greedy_accept(t(5, 6, 7), t(9, 6, 7, 8))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token, v.accept_length) == ([], [], 9, 1)


def test_greedy_all_accepted_bonus_is_last_target_token():
    v = greedy_accept(t(5, 6, 7), t(5, 6, 7, 8))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token, v.accept_length) == (
        [1, 2, 3], [5, 6, 7], 8, 4)


def test_greedy_partial_stops_at_first_miss():
    # position 2 misses; the later match at position 3 must not count
    v = greedy_accept(t(5, 6, 7, 4), t(5, 6, 1, 4, 0))
    assert (v.accepted_tokens, v.bonus_token, v.accept_length) == ([5, 6], 1, 3)


# ---- walk_tree ------------------------------------------------------------------------------

def test_walk_tree_on_chain_matches_greedy_accept():
    drafts = [5, 6, 7, 4]
    for target_tokens in ([5, 6, 1, 4, 0], [5, 6, 7, 4, 3], [2, 6, 7, 4, 3], [5, 3, 7, 4, 3]):
        tree = walk_tree(chain_children(len(drafts), drafts), t(*target_tokens))
        linear = greedy_accept(t(*drafts), t(*target_tokens))
        assert tree == linear


def test_chain_children_shape():
    assert chain_children(3, [5, 6, 7]) == [{5: 1}, {6: 2}, {7: 3}, {}]


def test_walk_tree_branching():
    #        0 (root)
    #      5/   \8
    #      1     2
    #    6/ \7    \9
    #    3   4     5
    children = [{5: 1, 8: 2}, {6: 3, 7: 4}, {9: 5}, {}, {}, {}]
    # target picks 8 at the root, 9 after it, then 4 after node 5
    v = walk_tree(children, t(8, 0, 9, 0, 0, 4))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token) == ([2, 5], [8, 9], 4)
    # target picks 5, then 7 (second child), then 11 after leaf 4
    v = walk_tree(children, t(5, 7, 0, 0, 11, 0))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token) == ([1, 4], [5, 7], 11)
    # target picks 5, then 3 which no child drafts: stop at node 1, bonus 3
    v = walk_tree(children, t(5, 3, 0, 0, 0, 0))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token) == ([1], [5], 3)
    # root token not drafted at all
    v = walk_tree(children, t(2, 0, 0, 0, 0, 0))
    assert (v.accepted_nodes, v.accepted_tokens, v.bonus_token, v.accept_length) == ([], [], 2, 1)


# ---- rejection_accept: exact distribution by Monte Carlo ------------------------------------

V, K, N_TOKENS = 5, 2, 3


class Table:
    """A distribution over V tokens for every prefix, drawn once from a fixed seed."""

    def __init__(self, seed: int, scale: float):
        self.gen = torch.Generator().manual_seed(seed)
        self.scale = scale
        self.rows: dict[tuple, torch.Tensor] = {}

    def __call__(self, prefix) -> torch.Tensor:
        prefix = tuple(prefix)
        if prefix not in self.rows:
            logits = torch.randn(V, generator=self.gen, dtype=torch.float64) * self.scale
            self.rows[prefix] = torch.softmax(logits, dim=0)
        return self.rows[prefix]


def speculative_sequence(p, q, gen, accept=rejection_accept, paths=None):
    """N_TOKENS tokens by rounds of K drafts sampled from q, verified against p."""
    out: list[int] = []
    while len(out) < N_TOKENS:
        drafts, draft_probs = [], []
        for _ in range(K):
            row = q(out + drafts)
            drafts.append(int(torch.multinomial(row, 1, generator=gen)))
            draft_probs.append(row)
        target_probs = torch.stack([p(out + drafts[:i]) for i in range(K + 1)])
        verdict = accept(torch.tensor(drafts), torch.stack(draft_probs), target_probs, gen)
        if paths is not None:
            paths[len(verdict.accepted_tokens)] += 1
        out += verdict.accepted_tokens + [verdict.bonus_token]
    return tuple(out[:N_TOKENS])


def exact_joint(p):
    joint = {}
    for seq in itertools.product(range(V), repeat=N_TOKENS):
        prob = 1.0
        for i in range(N_TOKENS):
            prob *= float(p(seq[:i])[seq[i]])
        joint[seq] = prob
    return joint


@pytest.fixture(scope="module")
def tables():
    p, q = Table(seed=1, scale=1.2), Table(seed=2, scale=1.2)
    # the draft must differ from the target so that the residual path matters
    assert (p(()) - q(())).abs().max() > 0.1
    return p, q


def test_rejection_accept_reproduces_target_distribution(tables):
    p, q = tables
    gen = torch.Generator().manual_seed(1234)
    paths = [0] * (K + 1)
    samples = [speculative_sequence(p, q, gen, paths=paths) for _ in range(8000)]
    # both the residual path (0 or 1 accepted) and the all-accepted path ran often
    assert min(paths) > 500, paths
    pvalue = chi_square_pvalue(samples, exact_joint(p))
    assert pvalue > 1e-3, pvalue


def test_monte_carlo_detects_a_wrong_residual(tables):
    """Power check: resampling from p instead of norm(max(p - q, 0)) after a rejection biases
    the output, and the same test must see it."""
    p, q = tables

    def naive(draft_tokens, draft_probs, target_probs, gen):
        v = rejection_accept(draft_tokens, draft_probs, target_probs, gen)
        n = len(v.accepted_tokens)
        if n < len(draft_tokens):  # rejected: redraw the bonus from p, ignoring q
            bonus = int(torch.multinomial(target_probs[n], 1, generator=gen))
            return Verdict(v.accepted_nodes, v.accepted_tokens, bonus)
        return v

    gen = torch.Generator().manual_seed(1234)
    samples = [speculative_sequence(p, q, gen, accept=naive) for _ in range(8000)]
    assert chi_square_pvalue(samples, exact_joint(p)) < 1e-6


def test_rejection_accept_point_mass_draft_accepts_with_probability_p():
    """One-hot q (DFlash drafts the argmax): accept d with probability p(d)."""
    target = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=torch.float64)
    draft_probs = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    n = 10000
    first = [rejection_accept(torch.tensor([1]), draft_probs, target, gen) for _ in range(n)]
    accepted = sum(len(v.accepted_tokens) for v in first)
    assert abs(accepted / n - 0.3) < 0.02  # 4 standard deviations
    # on rejection the bonus is never the rejected token
    assert all(v.bonus_token != 1 for v in first if not v.accepted_tokens)


def test_rejection_accept_equal_distributions_always_accepts():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        v = rejection_accept(torch.tensor([0, 2]), probs[:2], probs, gen)
        assert v.accepted_tokens == [0, 2] and v.accept_length == 3


def test_rejection_accept_rejects_token_the_draft_could_not_propose():
    target = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    v = rejection_accept(torch.tensor([0]), torch.tensor([[0.0, 1.0]], dtype=torch.float64),
                         target, torch.Generator().manual_seed(0))
    assert v.accepted_tokens == [] and v.bonus_token == 1


# ---- SpecStats ------------------------------------------------------------------------------

def test_spec_stats_tau_counts_the_bonus():
    stats = SpecStats()
    assert stats.mean_accept_length == 0.0 and stats.num_steps == 0
    stats.record(Verdict([1, 2], [5, 6], 7), num_drafted=15)
    stats.record(Verdict([], [], 3), num_drafted=15)
    stats.record(Verdict([1, 2, 3, 4], [1, 2, 3, 4], 5), num_drafted=15)
    assert stats.accept_lengths == [3, 1, 5]
    assert stats.mean_accept_length == pytest.approx(3.0)
    assert stats.accepted_tokens == 6
    assert stats.drafted_tokens == 45
    assert stats.num_steps == 3


def test_matching_prefix_length_stops_at_the_first_miss_or_the_shorter_list():
    assert matching_prefix_length([5, 6, 7], [5, 6, 9, 7]) == 2
    assert matching_prefix_length([1, 2], [1, 2, 3]) == 2
    assert matching_prefix_length([1, 2, 3], [1, 2]) == 2  # the answer ended
    assert matching_prefix_length([4], [3]) == 0
    assert matching_prefix_length([], [1]) == 0
