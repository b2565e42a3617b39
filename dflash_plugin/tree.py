"""DDTree draft trees: the most probable prefixes under the drafter's per-position marginals,
flattened for one target pass with tree (ancestor-only) attention. Pure tensor/list code.

One drafter pass gives log q_d(.) for depths d = 1..L. Treating depths as independent, a prefix
(y_1..y_d) scores sum_i log q_i(y_i), and the expected acceptance length of a tree is the sum of
its nodes' probabilities, so the best tree of B nodes is the B most probable prefixes (DDTree
Prop. 2). They are prefix-closed, and only the top-K tokens per depth can appear, K = min(B, V).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from dflash_plugin.errors import DFlashError


@dataclass
class DraftTree:
    """Nodes in pop order; node 0 is the root (the bonus token), every parent precedes its children."""

    tokens: list[int]
    parents: list[int]  # -1 for the root
    depths: list[int]  # root 0
    children: list[dict[int, int]]  # token -> child node, as acceptance.walk_tree reads it

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def num_drafted(self) -> int:
        return len(self.tokens) - 1

    def add(self, parent: int, token: int) -> int:
        """Append a node drafting `token` under `parent`; returns its index."""
        node = self.num_nodes
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append({})
        self.children[parent][token] = node
        return node


def top_candidates(log_probs: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K log-probs and their (draft-vocabulary) ids per depth, sorted: ([L, K], [L, K])."""
    k = min(budget, log_probs.shape[-1])
    values, ids = torch.topk(log_probs.float(), k, dim=-1, sorted=True)
    return values, ids


def build_tree(root_token: int, top_log_probs: torch.Tensor, top_ids: torch.Tensor,
               budget: int) -> DraftTree:
    """Best-first construction (DDTree Algorithm 1) of the `budget` most probable prefixes.

    top_log_probs / top_ids [L, K]: per depth, candidates sorted by decreasing log-prob (ids
    already in the target vocabulary). A heap entry is a prefix in rank space, kept as (its
    parent node, depth, rank of its last token); popping one adds it to the tree and pushes its
    next sibling and its first child. Scores only fall along both moves, so pops come out in
    decreasing probability: O(B log B), at most B pops and 2B pushes.
    """
    if budget < 1:
        raise DFlashError(f"tree budget must be >= 1, got {budget}")
    scores, ids = top_log_probs.tolist(), top_ids.tolist()
    depth_limit, k = len(scores), len(scores[0]) if scores else 0
    tree = DraftTree([root_token], [-1], [0], [{}])
    log_q = [0.0]  # per node: log-probability of its prefix (root: given)
    # (-log q, tie-break counter, parent node, depth index 0..L-1, rank)
    heap = [(-scores[0][0], 0, 0, 0, 0)] if depth_limit and k else []
    pushes = 1
    while heap and tree.num_drafted < budget:
        neg, _, parent, d, rank = heapq.heappop(heap)
        node = tree.add(parent, ids[d][rank])  # its depth is d + 1: parents sit at depth d
        log_q.append(-neg)
        if rank + 1 < k:  # next sibling: this depth's next-ranked token under the same parent
            heapq.heappush(heap, (-(log_q[parent] + scores[d][rank + 1]), pushes, parent, d, rank + 1))
            pushes += 1
        if d + 1 < depth_limit:  # first child: extend with the next depth's top token
            heapq.heappush(heap, (-(log_q[node] + scores[d + 1][0]), pushes, node, d + 1, 0))
            pushes += 1
    return tree


def visibility(tree: DraftTree) -> torch.Tensor:
    """Boolean [n, n]: node i sees node j iff j is i itself or one of its ancestors."""
    n = tree.num_nodes
    visible = torch.eye(n, dtype=torch.bool)
    for node in range(1, n):  # parents come first, so their rows are already complete
        visible[node] |= visible[tree.parents[node]]
    return visible


def tree_attention_mask(tree: DraftTree, prefix_len: int, dtype: torch.dtype,
                        device=None) -> torch.Tensor:
    """Additive mask [1, 1, n, prefix_len + n] for the target's verify pass: every node sees the
    whole committed prefix (in the KV cache) and its own ancestors; 0 = visible, min = hidden.
    A float mask, not a boolean one, because eager attention adds the mask to the scores."""
    n = tree.num_nodes
    visible = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), visibility(tree)], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def tree_positions(tree: DraftTree, start: int, device=None) -> torch.Tensor:
    """Position ids [1, n]: a node at depth d sits at start + d (the root, the bonus, at start)."""
    return (start + torch.tensor(tree.depths, dtype=torch.long, device=device))[None]
