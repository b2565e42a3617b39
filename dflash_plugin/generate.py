"""Reference decoding on Hugging Face models: plain autoregressive decoding, and DFlash
speculative decoding (`spec_generate`). Batch size 1; the oracle the engine adapters are
tested against."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from dflash_plugin import kv_cache
from dflash_plugin.acceptance import SpecStats, chain_children, greedy_accept, walk_tree
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.errors import DFlashError
from dflash_plugin.features import FeatureCapture, check_pair
from dflash_plugin.layout import block_input_ids
from dflash_plugin.lookup_hints import hinted_block, uses_lookup_hints
from dflash_plugin.sampling import SamplingParams, choose_tokens


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "stop" (a stop token was emitted) or "length"
    num_target_passes: int
    wall_s: float
    stats: SpecStats = field(default_factory=SpecStats)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.wall_s if self.wall_s > 0 else 0.0


class _Output:
    """Collects emitted tokens, applying stop tokens and the length limit."""

    def __init__(self, max_new_tokens: int, stop_token_ids: set[int]):
        self.tokens: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def emit(self, tokens: list[int]):
        for token in tokens:
            self.tokens.append(token)
            if token in self.stop_token_ids:
                self.finish_reason = "stop"
                return
            if self.remaining == 0:
                self.finish_reason = "length"
                return


def _check_request(input_ids: torch.Tensor, max_new_tokens: int, target: nn.Module):
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise DFlashError(f"input_ids must have shape [1, T], got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise DFlashError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise DFlashError(f"prompt of {input_ids.shape[1]} tokens plus max_new_tokens "
                          f"{max_new_tokens} exceeds the target's context of {limit} tokens")


@torch.inference_mode()
def generate_plain(target: nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingParams = SamplingParams(), seed: int = 0,
                   stop_token_ids: set[int] | frozenset = frozenset()) -> GenerationResult:
    """The target alone, one token per pass: the baseline every speculative path must match."""
    _check_request(input_ids, max_new_tokens, target)
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache(config=target.config)
    out = _Output(max_new_tokens, set(stop_token_ids))
    began = time.perf_counter()
    logits = target(input_ids, past_key_values=cache, use_cache=True).logits[0, -1]
    passes = 1
    while True:
        token = int(choose_tokens(logits, sampling, generator))
        out.emit([token])
        if out.finish_reason:
            break
        logits = target(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
        passes += 1
    return GenerationResult(out.tokens, out.finish_reason, passes, time.perf_counter() - began)


class SpecDecoder:
    """DFlash speculative decoding of one request at a time on a Hugging Face target."""

    def __init__(self, target: nn.Module, drafter: DFlashDraftModel, block_size: int | None = None,
                 num_verify_tokens: int | None = None):
        """block_size: tokens per drafter pass (default: the drafter's trained block).
        num_verify_tokens: tokens per verify pass, the bonus token included (default: the whole
        block). Verifying only the first drafts is cheaper where a verify pass costs more per
        token (a CPU) and the later drafts are rarely accepted; the drafter still fills its
        whole trained block, so the drafts themselves do not change."""
        check_pair(target, drafter.fields, drafter.config.hidden_size, drafter.config.vocab_size)
        self.target = target
        self.drafter = drafter
        self.block_size = block_size or drafter.block_size
        if self.block_size < 2:
            raise DFlashError(f"block size must be >= 2, got {self.block_size}")
        self.num_verify_tokens = num_verify_tokens or self.block_size
        if not 2 <= self.num_verify_tokens <= self.block_size:
            raise DFlashError(f"tokens per verify pass must be in 2..{self.block_size} (the "
                              f"block size), got {self.num_verify_tokens}")
        self.capture = FeatureCapture(target, drafter.fields.target_layer_ids)
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        # The request's tokens so far, prompt and output, the latest bonus token last.
        self.history: list[int] = []

    def block_ids(self, bonus: int, block: int) -> list[int]:
        """The drafter's input block: the bonus token, then masks (or, for a drafter trained
        with them, the prompt lookup's continuation of the history)."""
        if uses_lookup_hints(self.drafter):
            return hinted_block(bonus, self.drafter.mask_token_id, block, self.history)
        return block_input_ids(bonus, self.drafter.mask_token_id, block)

    def draft_logits(self, bonus: int, start: int, context: torch.Tensor, cache,
                     block: int, num_drafts: int | None = None) -> torch.Tensor:
        """Draft-vocabulary logits [num_drafts, V_draft] (default block-1) after `bonus` (at
        position `start`), from one drafter pass over the whole block.

        context: fused features of the positions [len(cache), start) not yet in the cache.
        """
        ids = torch.tensor([self.block_ids(bonus, block)])
        ctx_positions = torch.arange(len(cache), start)[None]
        block_positions = torch.arange(start, start + block)[None]
        hidden = self.drafter(self.embed(ids), context, block_positions, ctx_positions, cache=cache)
        end = block if num_drafts is None else 1 + num_drafts
        return self.drafter.draft_logits(hidden[0, 1:end], self.lm_head)

    def draft(self, bonus: int, start: int, context: torch.Tensor, cache, block: int,
              num_drafts: int | None = None) -> torch.Tensor:
        """The first num_drafts (default block-1) draft tokens (target ids) after `bonus`: the
        drafter's argmax per position."""
        logits = self.draft_logits(bonus, start, context, cache, block, num_drafts)
        return self.drafter.to_target_ids(logits.argmax(dim=-1))

    def speculate(self, bonus: int, start: int, context: torch.Tensor, caches: tuple,
                  block: int, sampling: SamplingParams, generator: torch.Generator):
        """One draft + verify round: (verdict, target features of the committed tokens
        [bonus + accepted], number of drafted tokens). Leaves the target cache holding exactly
        the committed prefix before the new bonus token."""
        target_cache, draft_cache = caches
        num_drafts = min(block, self.num_verify_tokens) - 1
        drafts = self.draft(bonus, start, context, draft_cache, block, num_drafts)
        verdict, features = self.verify_chain(bonus, drafts, start, target_cache, sampling,
                                            generator)
        return verdict, features, num_drafts

    def verify_chain(self, bonus: int, drafts: torch.Tensor, start: int, target_cache,
                     sampling: SamplingParams, generator: torch.Generator):
        """One target pass over bonus + drafts [K] (K may be 0): (verdict, target features of
        the committed tokens [bonus + accepted]); the cache keeps exactly those tokens."""
        verify_ids = torch.cat([torch.tensor([bonus]), drafts])[None]
        logits = self.target(verify_ids, past_key_values=target_cache, use_cache=True).logits
        target_tokens = choose_tokens(logits[0], sampling, generator)
        if sampling.greedy:
            verdict = greedy_accept(drafts, target_tokens)
        else:
            verdict = walk_tree(chain_children(len(drafts), drafts.tolist()), target_tokens)
        n = len(verdict.accepted_tokens)
        features = self.capture.take()[:, : n + 1]
        kv_cache.truncate(target_cache, start + n + 1)
        return verdict, features

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), seed: int = 0,
                 stop_token_ids: set[int] | frozenset = frozenset()) -> GenerationResult:
        _check_request(input_ids, max_new_tokens, self.target)
        generator = torch.Generator().manual_seed(seed)
        out = _Output(max_new_tokens, set(stop_token_ids))
        stats = SpecStats()
        target_cache = DynamicCache(config=self.target.config)
        draft_cache = self.drafter.new_cache()
        began = time.perf_counter()
        with self.capture.active():
            logits = self.target(input_ids, past_key_values=target_cache, use_cache=True).logits
            passes = 1
            bonus = int(choose_tokens(logits[0, -1], sampling, generator))
            features = self.capture.take()
            start = input_ids.shape[1]
            out.emit([bonus])
            prompt = input_ids[0].tolist()
            while not out.finish_reason:
                self.history = prompt + out.tokens
                # Never verify more tokens than may still be emitted.
                block = min(self.block_size, out.remaining + 1)
                context = self.drafter.fuse_context(features)
                verdict, features, drafted = self.speculate(
                    bonus, start, context, (target_cache, draft_cache), block, sampling, generator)
                passes += 1
                stats.record(verdict, drafted)
                start += verdict.accept_length
                bonus = verdict.bonus_token
                out.emit(verdict.accepted_tokens + [bonus])
        return GenerationResult(out.tokens, out.finish_reason, passes,
                                time.perf_counter() - began, stats)
