"""Teacher-forced acceptance: how far a drafter's block matches the target's own answer at every
answer position, from one target pass and one drafter pass per sequence.

Cheap (seconds per sequence, no decoding), so it judges training data before training is spent
on it: the same drafter on answers from two prompt sources says which one it has learnt, and
a drafter trained on a source against its start says whether that source carries over to the
answers that matter (docs/history.md, round 18).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from dflash_plugin.acceptance import walk_tree
from dflash_plugin.features import FeatureCapture
from dflash_plugin.lookup_hints import fill_batch_hints, uses_lookup_hints
from dflash_plugin.ngram import find_ngram_draft
from dflash_plugin.train.batches import draft_block_batch, leading_matches, make_block_batch
from dflash_plugin.train.feature_store import target_features
from dflash_plugin.tree import DraftTree, top_candidates


def with_pass_length(drafter, positions: int):
    """The same drafter (weights shared) drafting `positions` query positions a pass, the bonus
    token included, instead of its trained block: what a shorter, cheaper draft pass accepts
    (its masks see fewer masks after them than in training)."""
    if not 2 <= positions <= drafter.block_size:
        raise ValueError(f"a pass has 2..{drafter.block_size} positions (the trained block), "
                         f"got {positions}")
    short = copy.copy(drafter)
    short.fields = dataclasses.replace(drafter.fields, block_size=positions)
    return short


def answer_sequences(records: list[dict], answer_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt + first `answer_tokens` answer ids, prompt length) per record with at least two
    answer tokens (a block needs an anchor and one token after it)."""
    out = []
    for r in records:
        answer = r["response_ids"][:answer_tokens]
        if len(answer) >= 2:
            out.append((list(r["prompt_ids"]) + list(answer), len(r["prompt_ids"])))
    return out


def _block_logits(drafter, embed, head, features: torch.Tensor, ids: list[int],
                  prompt_len: int):
    """One drafter pass writing a block at every answer position but the last: the draft
    logits [N, block, V_draft] and the batch (labels, weights) they were drafted for."""
    dtype = next(drafter.parameters()).dtype
    context = drafter.fuse_context(features.to(dtype)[None])
    anchors = torch.arange(prompt_len, len(ids) - 1)
    batch = make_block_batch(torch.tensor(ids), anchors, drafter.block_size,
                             drafter.mask_token_id, gamma=1.0)
    if uses_lookup_hints(drafter):
        batch.block_ids = fill_batch_hints(batch.block_ids, ids, anchors, drafter.block_size)
    hidden = draft_block_batch(drafter, lambda t: embed(t).to(dtype), batch, context)
    logits = drafter.draft_logits(hidden, head)
    return logits.view(len(ids) - 1 - prompt_len, drafter.block_size, -1), batch


@torch.no_grad()
def block_acceptance(drafter, embed, head, features: torch.Tensor, ids: list[int],
                     prompt_len: int) -> torch.Tensor:
    """Accepted length (1 + leading matches, the bonus counted) of the block the drafter
    writes at each answer position but the last, given the target's features [len(ids), F]:
    at T=0 what decoding accepts when a block starts there."""
    logits, batch = _block_logits(drafter, embed, head, features, ids, prompt_len)
    guess = drafter.to_target_ids(logits.argmax(-1)).flatten()
    correct = (guess == batch.labels) & (batch.weights > 0)
    return 1 + leading_matches(correct, drafter.block_size)


@torch.no_grad()
def block_candidates(drafter, embed, head, features: torch.Tensor, ids: list[int],
                     prompt_len: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per answer position but the last, the top-k log-probs and target-vocabulary ids at each
    drafted depth ([N, block - 1, k] each), as a draft tree is built from them."""
    logits, _ = _block_logits(drafter, embed, head, features, ids, prompt_len)
    log_probs, draft_ids = top_candidates(torch.log_softmax(logits[:, 1:].float(), dim=-1), k)
    return log_probs, drafter.to_target_ids(draft_ids)


def tree_acceptance(tree: DraftTree, truth) -> int:
    """Accepted length (the bonus counted) of a draft tree whose root is the anchor, when the
    target's greedy continuation is `truth`: at a node of depth d on the path that spells it,
    the target's own token is truth[d] (-1, matching nothing, past its end)."""
    chosen = [int(truth[d]) if d < len(truth) else -1 for d in tree.depths]
    return 1 + len(walk_tree(tree.children, torch.tensor(chosen)).accepted_tokens)


def decoded_tau(accepted) -> float:
    """Tokens per target pass of greedy decoding that starts a block at answer position 0 and
    each next one where the last stopped, given the accepted length at every position."""
    position = steps = 0
    while position < len(accepted):
        position += int(accepted[position])
        steps += 1
    return position / steps if steps else 0.0


def ngram_acceptance(ids: list[int], prompt_len: int, block_size: int) -> torch.Tensor:
    """The same for a prompt-lookup draft of block_size - 1 tokens (vLLM's n-gram lookup,
    n = 2..4) from the history up to and including each anchor; 1 where nothing matches."""
    tokens = np.asarray(ids)
    out = torch.ones(len(ids) - 1 - prompt_len, dtype=torch.long)
    for i, anchor in enumerate(range(prompt_len, len(ids) - 1)):
        match = find_ngram_draft(tokens[:anchor + 1], block_size - 1)
        if match is None:
            continue
        truth = tokens[anchor + 1:anchor + block_size]
        hits = np.cumprod(match.tokens[:truth.shape[0]] == truth)
        out[i] = 1 + int(hits.sum())
    return out


# Buckets of the target's own probability for its next token (each from its lower edge on).
CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


@torch.no_grad()
def target_confidence(target, ids: list[int], prompt_len: int) -> torch.Tensor:
    """At each answer position but the last, the probability the target gives the token it
    wrote next: how sure the target was of what the drafter's first token must match."""
    logits = target(torch.tensor([ids], device=target.device)).logits[0, prompt_len:-1].float()
    nxt = torch.tensor(ids[prompt_len + 1:], device=logits.device)
    return logits.softmax(-1).gather(1, nxt[:, None])[:, 0].cpu()


def confidence_table(confidence: torch.Tensor, first_right: torch.Tensor) -> dict[str, dict]:
    """Per bucket of the target's confidence: its share of anchors and how often the drafter's
    first token is right there."""
    edges = torch.tensor(CONFIDENCE_EDGES)
    bucket = torch.bucketize(confidence, edges[1:-1], right=True)
    table = {}
    for b in range(len(CONFIDENCE_EDGES) - 1):
        hit = bucket == b
        table[f"{CONFIDENCE_EDGES[b]}-{CONFIDENCE_EDGES[b + 1]}"] = {
            "share": round(float(hit.float().mean()), 4),
            "first_right": round(float(first_right[hit].float().mean()), 4) if hit.any() else None}
    return table


@torch.no_grad()
def teacher_forced_tau(target, drafters: dict, sequences: list[tuple[list[int], int]],
                       ngram: bool = False, by_confidence: bool = False) -> dict[str, dict]:
    """Per drafter: mean accepted length over blocks anchored at every answer position but the
    last, pooled over sequences; how many blocks accepted each length (1..block); and the
    per-sequence means. Drafters reading the same target layers share the target pass.
    `ngram`: also prompt lookup ("ngram") and, per drafter, the better of the two at each
    anchor ("NAME|ngram", what a perfect per-step choice between them reaches).
    `by_confidence`: also each drafter's first-token accuracy per bucket of the target's own
    confidence in that token (confidence_table): low where the target itself is unsure is the
    target's doing, low where it is sure is the drafter's."""
    if not sequences:
        raise ValueError("no sequence with an answer to draft")
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    captures = {}
    block = {name: d.block_size for name, d in drafters.items()}
    if ngram:
        size = max(block.values())
        block |= {"ngram": size} | {f"{name}|ngram": size for name in drafters}
    lengths = {name: torch.zeros(size + 1, dtype=torch.long) for name, size in block.items()}
    per_seq = {name: [] for name in block}
    confidence, first_right = [], {name: [] for name in drafters}

    def add(name, accepted):
        lengths[name] += torch.bincount(accepted.long(), minlength=lengths[name].numel())
        per_seq[name].append(round(float(accepted.float().mean()), 4))

    for ids, prompt_len in sequences:
        feats = {}
        if by_confidence:
            confidence.append(target_confidence(target, ids, prompt_len))
        if ngram:
            lookup = ngram_acceptance(ids, prompt_len, block["ngram"])
            add("ngram", lookup)
        for name, drafter in drafters.items():
            layers = tuple(drafter.fields.target_layer_ids)
            if layers not in feats:
                capture = captures.setdefault(layers, FeatureCapture(target, layers))
                with capture.active():
                    feats[layers] = target_features(target, capture, ids, target.dtype)
            accepted = block_acceptance(drafter, embed, head, feats[layers], ids, prompt_len)
            add(name, accepted)
            first_right[name].append(accepted >= 2)
            if ngram:
                add(f"{name}|ngram", torch.maximum(accepted, lookup))
    out = {}
    for name, counts in lengths.items():  # counts[k]: blocks that accepted k tokens
        blocks = int(counts.sum())
        tau = float((torch.arange(counts.numel()) * counts).sum()) / blocks
        out[name] = {"tau": round(tau, 4), "blocks": blocks,
                     "accepted_lengths": counts[1:].tolist(), "per_sequence": per_seq[name]}
        if by_confidence and name in drafters:
            out[name]["first_token_by_target_confidence"] = confidence_table(
                torch.cat(confidence), torch.cat(first_right[name]))
    return out
