"""Draft-tree construction (DDTree Algorithm 1), flattening, tree attention mask and positions.
Pure tensor code, no model."""

import itertools

import pytest
import torch

from dflash_plugin.errors import DFlashError
from dflash_plugin.tree import (
    build_tree,
    top_candidates,
    tree_attention_mask,
    tree_positions,
    visibility,
)
from dflash_plugin.tree_decode import TreeDecoder


def random_log_probs(depth: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(depth, vocab, generator=g) * 2, dim=-1)


def tree_for(log_probs: torch.Tensor, budget: int, root: int = 99):
    values, ids = top_candidates(log_probs, budget)
    return build_tree(root, values, ids, budget)


def prefixes(tree) -> list[tuple[int, ...]]:
    """The token prefix each drafted node stands for (root excluded), in node order."""
    paths = [()]
    for node in range(1, tree.num_nodes):
        paths.append(paths[tree.parents[node]] + (tree.tokens[node],))
    return paths[1:]


def best_prefixes(log_probs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """Brute force: score every prefix of every length, keep the `budget` best."""
    depth, vocab = log_probs.shape
    scored = []
    for d in range(1, depth + 1):
        for prefix in itertools.product(range(vocab), repeat=d):
            scored.append((sum(float(log_probs[i, t]) for i, t in enumerate(prefix)), prefix))
    scored.sort(reverse=True)
    return {prefix for _, prefix in scored[:budget]}


@pytest.mark.parametrize("seed", range(6))
def test_tree_is_the_most_probable_prefixes(seed):
    log_probs = random_log_probs(3, 4, seed)
    for budget in range(1, 21):
        tree = tree_for(log_probs, budget)
        assert tree.num_drafted == budget
        assert set(prefixes(tree)) == best_prefixes(log_probs, budget)


def test_budget_beyond_all_prefixes_takes_them_all():
    log_probs = random_log_probs(2, 3, 0)
    assert len(prefixes(tree_for(log_probs, 50))) == 3 + 9


def test_only_top_k_per_depth_when_vocab_exceeds_budget():
    log_probs = random_log_probs(3, 8, 1)
    for budget in range(1, 8):  # K = budget < V: candidates are cut to the top-K per depth
        values, ids = top_candidates(log_probs, budget)
        assert values.shape == ids.shape == (3, budget)
        assert set(prefixes(build_tree(0, values, ids, budget))) == best_prefixes(log_probs, budget)


@pytest.mark.parametrize("seed", range(4))
def test_tree_structure_is_prefix_closed_and_consistent(seed):
    log_probs = random_log_probs(6, 10, seed)
    tree = tree_for(log_probs, 40, root=7)
    assert tree.tokens[0] == 7 and tree.parents[0] == -1 and tree.depths[0] == 0
    paths = set(prefixes(tree))
    scores = []
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        assert parent < node  # parents come first: flattening order is a valid topological order
        assert tree.depths[node] == tree.depths[parent] + 1
        assert tree.children[parent][tree.tokens[node]] == node
        path = prefixes(tree)[node - 1]
        assert path[:-1] in paths or len(path) == 1  # prefix-closed
        scores.append(sum(float(log_probs[i, t]) for i, t in enumerate(path)))
    assert sum(len(c) for c in tree.children) == tree.num_drafted
    # Best-first: nodes are popped in non-increasing probability.
    assert all(a >= b - 1e-6 for a, b in zip(scores, scores[1:]))


def test_tree_depth_is_limited_by_the_draft_length():
    tree = tree_for(random_log_probs(2, 30, 3), 25)
    assert max(tree.depths) <= 2


def test_mask_is_ancestor_only_plus_the_whole_prefix():
    tree = tree_for(random_log_probs(5, 6, 2), 20)
    n, prefix = tree.num_nodes, 9
    mask = tree_attention_mask(tree, prefix, torch.float32)
    assert mask.shape == (1, 1, n, prefix + n) and mask.dtype == torch.float32
    visible = mask[0, 0] == 0
    assert torch.all(mask[0, 0][~visible] == torch.finfo(torch.float32).min)
    assert visible[:, :prefix].all()
    for i in range(n):
        ancestors, node = set(), i
        while node != -1:
            ancestors.add(node)
            node = tree.parents[node]
        assert {j for j in range(n) if visible[i, prefix + j]} == ancestors
    assert torch.equal(visibility(tree), visible[:, prefix:])


def test_mask_dtype_follows_the_target():
    tree = tree_for(random_log_probs(3, 4, 0), 5)
    mask = tree_attention_mask(tree, 2, torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and mask.min() == torch.finfo(torch.bfloat16).min


def test_positions_are_start_plus_depth():
    tree = tree_for(random_log_probs(4, 5, 4), 15)
    positions = tree_positions(tree, 123)
    assert positions.shape == (1, tree.num_nodes)
    assert positions[0].tolist() == [123 + d for d in tree.depths]


def test_ids_are_taken_as_given():
    """Reduced draft vocabularies: the tree keeps whatever (target) ids it is handed."""
    log_probs = random_log_probs(3, 4, 5)
    values, ids = top_candidates(log_probs, 6)
    mapped = build_tree(0, values, ids * 10 + 1000, 6)
    plain = build_tree(0, values, ids, 6)
    assert mapped.tokens[1:] == [t * 10 + 1000 for t in plain.tokens[1:]]
    assert mapped.parents == plain.parents


def test_budget_must_be_positive():
    values, ids = top_candidates(random_log_probs(3, 4, 0), 1)
    with pytest.raises(DFlashError, match="budget"):
        build_tree(0, values, ids, 0)
    with pytest.raises(DFlashError, match="budget"):
        TreeDecoder(None, None, budget=0)
