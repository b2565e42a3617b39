"""DDTree on the Hugging Face reference path: DFlash decoding where each round verifies a draft
tree (the most probable prefixes of one drafter pass) instead of a single chain.

The loop, prefill and stopping rules are SpecDecoder's; only a round differs: drafter
log-probs -> best-first tree -> one target pass with tree attention -> walk the tree with the
target's own token at every node -> compact the target KV cache to the accepted path.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_plugin import kv_cache
from dflash_plugin.acceptance import walk_tree
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.errors import DFlashError
from dflash_plugin.generate import SpecDecoder
from dflash_plugin.sampling import SamplingParams, choose_tokens
from dflash_plugin.tree import DraftTree, build_tree, top_candidates, tree_attention_mask, tree_positions


class TreeDecoder(SpecDecoder):
    """`budget` = drafted nodes per tree (the root, the bonus token, is extra); the tree is at
    most block_size-1 deep."""

    def __init__(self, target: nn.Module, drafter: DFlashDraftModel, budget: int,
                 block_size: int | None = None):
        if budget < 1:
            raise DFlashError(f"tree budget must be >= 1, got {budget}")
        super().__init__(target, drafter, block_size)
        self.budget = budget

    def draft_tree(self, bonus: int, start: int, context: torch.Tensor, cache, block: int) -> DraftTree:
        """One drafter pass over a block, turned into the best tree of `budget` nodes."""
        logits = self.draft_logits(bonus, start, context, cache, block)
        # Plain softmax of the draft logits (no temperature), as DDTree builds its trees.
        log_probs, draft_ids = top_candidates(torch.log_softmax(logits.float(), dim=-1), self.budget)
        return build_tree(bonus, log_probs, self.drafter.to_target_ids(draft_ids), self.budget)

    def verify(self, tree: DraftTree, start: int, target_cache) -> torch.Tensor:
        """Target logits [n, V] at every tree node, from one pass over the flattened tree."""
        ids = torch.tensor([tree.tokens])
        mask = tree_attention_mask(tree, start, self.embed.weight.dtype)
        out = self.target(ids, attention_mask=mask, position_ids=tree_positions(tree, start),
                          past_key_values=target_cache, use_cache=True)
        return out.logits[0]

    def speculate(self, bonus: int, start: int, context: torch.Tensor, caches: tuple,
                  block: int, sampling: SamplingParams, generator: torch.Generator):
        """One tree round; same contract as SpecDecoder.speculate."""
        target_cache, draft_cache = caches
        tree = self.draft_tree(bonus, start, context, draft_cache, block)
        # The target's own choice at every node (a sample per node when sampling): only the
        # walked path's choices are used, so each emitted token is an exact target draw.
        target_tokens = choose_tokens(self.verify(tree, start, target_cache), sampling, generator)
        verdict = walk_tree(tree.children, target_tokens)
        path = [0] + verdict.accepted_nodes  # node i sits at cache index start + i
        features = self.capture.take()[:, path]
        kv_cache.keep_positions(target_cache, start, [start + node for node in path])
        return verdict, features, tree.num_drafted
