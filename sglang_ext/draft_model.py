"""The DFlash drafter as an SGLang model: the shared core's weights and math on SGLang's paged KV
cache and attention backends.

SGLang's DFLASH worker (`speculative/dflash_worker_v2.py`) drives the draft model in two ways:

* KV injection. After every target pass it fuses the captured target features
  (`project_target_hidden`) and, for each layer, writes the context's K/V into the draft KV pool
  at the target's slot ids: `self_attn.kv_proj_only` -> `apply_k_norm` -> `apply_k_rope`.
* Block drafting. It runs `forward` on the block [bonus, MASK, ...] as a TARGET_VERIFY batch whose
  `RadixAttention` is ENCODER_ONLY, so the attention backend (FlashInfer, FA3/FA4, Triton) lets
  every block query see the whole cached context plus every block token.

Both are thin adapters over `dflash_plugin.drafter`: the modules (and so the parameter names, equal
to the published checkpoints') are the core drafter's, `project_target_hidden` is the core's
`fuse_context`, and the K/V of a token is the core's `project_kv` split into the three steps the
worker calls. Only the attention call itself is SGLang's. tests/sglang/ check that this class
provides everything the installed worker calls (S4 in docs/engine-ledger.md), and drafts the same
tokens as the core.
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

import torch
from torch import nn

from dflash_plugin import drafter as core
from sglang.srt.configs.draft_parallel import DraftParallelSpec, DraftTPExecution
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
from sglang.srt.utils import is_npu

logger = logging.getLogger(__name__)

# Features of SGLang's own DFlash family this drafter does not implement; checkpoints with them
# stay with SGLang's own drafter (sglang_ext.registration).
_UNSUPPORTED_DFLASH_KEYS = ("conv_kernel_size", "selector_rank", "projector_type",
                            "attention_sink_bias", "attention_value_scale",
                            "output_multiplier", "final_logit_softcapping")


def tensor_parallel_size() -> int:
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().tp_size)
    except (ValueError, RuntimeError):  # nothing published: built outside a server (tests, tools)
        return 1


def unsupported_settings(config, quantization=None, tp_size: int | None = None) -> list[str]:
    """The settings of this checkpoint/launch the drafter cannot honour (SGLang's own can)."""
    problems = []
    extra = getattr(config, "dflash_config", None) or {}
    problems += [f"dflash_config.{key}" for key in _UNSUPPORTED_DFLASH_KEYS
                 if extra.get(key) not in (None, 0, False)]
    if getattr(config, "layer_types", None) and any(
            t != "full_attention" for t in config.layer_types):
        problems.append("sliding-window layers (layer_types)")
    if getattr(config, "is_causal", None) or extra.get("is_causal") or extra.get("causal"):
        problems.append("causal draft attention (is_causal)")
    if getattr(config, "use_gemma_norm", False):
        problems.append("Gemma-style norms (use_gemma_norm)")
    draft_vocab = getattr(config, "draft_vocab_size", None)
    if draft_vocab is not None and draft_vocab != config.vocab_size:
        problems.append("a reduced draft vocabulary (draft_vocab_size)")
    if quantization is not None:
        name = quantization if isinstance(quantization, str) else type(quantization).__name__
        problems.append(f"quantization ({name})")
    if is_npu():
        problems.append("Ascend NPUs (the worker's NPU path needs SGLang's fused qkv kernels)")
    tp_size = tensor_parallel_size() if tp_size is None else tp_size
    if tp_size != 1:
        problems.append(f"tensor parallelism (tp_size={tp_size}): the drafter's layers are not "
                        "sharded")
    return problems


def refuse_unsupported(config, quant_config) -> None:
    """Raise ValueError naming any setting of this checkpoint/launch the drafter cannot honour
    (reached only when the class is built directly: SGLang's resolver gives such checkpoints
    SGLang's own drafter)."""
    problems = unsupported_settings(config, quant_config)
    if problems:
        raise ValueError("dflash-plugin's SGLang drafter does not support " + "; ".join(problems)
                         + ". SGLang's own DFlash drafter serves this checkpoint (leave "
                         "DFLASH_SGLANG_DRAFTER unset).")


def _rope_tokens(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The core's RoPE on token-major heads: x [N, heads, hd], cos/sin [1, N, hd]."""
    return core.apply_rope(x.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)


class SGLangDraftAttention(core.DraftAttention):
    """One layer's attention: the core module's projections and norms, SGLang's attention op.

    Built around an existing core `DraftAttention` whose weights it takes over (the core's own
    `__init__` would allocate them a second time), so `project_kv` and `_heads` are the core's.
    """

    def __init__(self, base: core.DraftAttention, layer_id: int, rotary: nn.Module):
        nn.Module.__init__(self)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            setattr(self, name, getattr(base, name))
        self.num_heads, self.num_kv_heads = base.num_heads, base.num_kv_heads
        self.head_dim = base.head_dim
        self._rotary = (rotary,)  # shared with the model; a tuple keeps it out of the submodules
        # ENCODER_ONLY: the backend runs its prefill kernel without a causal mask, so a block
        # query sees all cached context plus the whole block (the DFlash rule, layout.py).
        self.attn = RadixAttention(num_heads=self.num_heads, head_dim=self.head_dim,
                                   scaling=self.head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
                                   layer_id=layer_id, attn_type=AttentionType.ENCODER_ONLY)

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """cos/sin [1, N, hd] for positions [N]."""
        return self._rotary[0](like, positions.view(1, -1))

    # --- KV injection, called by the worker per layer on the fused context [N, H] ------------

    def kv_proj_only(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [N, kv_heads * hd] before k-norm and RoPE."""
        return self.k_proj(hidden_states), self.v_proj(hidden_states)

    def apply_k_norm(self, k: torch.Tensor) -> torch.Tensor:
        return self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim)).view_as(k)

    def apply_k_rope(self, positions: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope(positions, k)
        heads = k.view(-1, self.num_kv_heads, self.head_dim)
        return _rope_tokens(heads, cos, sin).reshape(k.shape)

    # --- block drafting ------------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                forward_batch: ForwardBatch) -> torch.Tensor:
        """hidden_states [N, H] (normed) of the batch's block tokens -> attention output [N, H].
        The block's own K/V go to the pool at `forward_batch.out_cache_loc` (the backend writes
        them) and are overwritten by the target's features once the block is verified."""
        n = hidden_states.shape[0]
        q = self.q_norm(self._heads(self.q_proj(hidden_states)[None], self.num_heads))[0]
        q = _rope_tokens(q, cos, sin)
        k, v = self.project_kv(hidden_states[None], cos, sin)  # [1, kv_heads, N, hd]
        k, v = k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()
        out = self.attn(q.reshape(n, -1), k, v, forward_batch)
        return self.o_proj(out.reshape(n, -1))


class SGLangDraftLayer(nn.Module):
    """The core decoder layer (pre-norm attention and MLP, residuals) around SGLang attention."""

    def __init__(self, base: core.DraftDecoderLayer, layer_id: int, rotary: nn.Module):
        super().__init__()
        self.self_attn = SGLangDraftAttention(base.self_attn, layer_id, rotary)
        self.mlp = base.mlp
        self.input_layernorm = base.input_layernorm
        self.post_attention_layernorm = base.post_attention_layernorm

    def forward(self, h, cos, sin, forward_batch):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, forward_batch)
        return h + self.mlp(self.post_attention_layernorm(h))


# S4 (docs/engine-ledger.md): the draft-model contract of SGLang's DFLASH worker.
class DFlashDraftModel(core.DFlashDraftModel):
    """Registered in SGLang's model registry under the published checkpoints' architecture name,
    so `--speculative-algorithm DFLASH` loads this class for them (sglang_ext.plugin)."""

    draft_parallel_spec = DraftParallelSpec(tp_execution=DraftTPExecution.SINGLE_GROUP)
    # The worker's fused Triton KV writer reads SGLang's fused qkv_proj weight; we keep the core's
    # separate projections, so the worker takes its per-layer path through kv_proj_only & co.
    supports_fused_context_kv = False
    supports_quantization = False
    candidate_selector = None  # DFlash2 path selector: not part of this drafter
    lilicorr = None  # LiLiCorr head: idem
    is_nemotron_35_draft = False
    shift_label = None

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        refuse_unsupported(config, quant_config)
        super().__init__(config)
        self.layers = nn.ModuleList(SGLangDraftLayer(layer, i, self.rotary_emb)
                                    for i, layer in enumerate(self.layers))
        # SGLang's parse of the same config: the worker reads mask token, block size and target
        # layer ids from it, so both must agree with the core's reading (`self.fields`).
        self.draft_config = parse_dflash_draft_config(draft_hf_config=config)
        self._block_size = self.fields.block_size
        logger.info("dflash-plugin drafter: %d layers, block size %d, target layers %s, mask %d",
                    len(self.layers), self.block_size, list(self.fields.target_layer_ids),
                    self.fields.mask_token_id)

    @property
    def block_size(self) -> int:
        return self._block_size

    def set_block_size(self, block_size: int) -> None:
        """The worker's block size (--speculative-num-draft-tokens); the drafter itself works for
        any block length."""
        self._block_size = int(block_size)

    def get_input_embeddings(self) -> Optional[nn.Module]:
        return None  # the worker embeds the block with the target's embedding

    def get_attention_sliding_window_size(self) -> Optional[int]:
        return None  # full attention in every layer (refuse_unsupported)

    def project_target_hidden(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [N, n_feat * H_t] -> fused context [N, H]."""
        expected = self.fc.in_features
        if target_hidden.ndim != 2 or target_hidden.shape[-1] != expected:
            raise ValueError(
                f"DFlash drafter expects target features of shape [N, {expected}] "
                f"({len(self.fields.target_layer_ids)} layers x {self.fields.target_hidden_size}),"
                f" got {tuple(target_hidden.shape)}: the target captured other layers than the "
                f"drafter's target_layer_ids {list(self.fields.target_layer_ids)}")
        return self.fuse_context(target_hidden)

    def prepare_context_hidden_for_kv(self, layer: nn.Module, ctx_hidden: torch.Tensor):
        return ctx_hidden  # every layer projects the same fused context (KV injection)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: Optional[torch.Tensor] = None,
                get_embedding: bool = False, pp_proxy_tensors=None) -> LogitsProcessorOutput:
        """Normed hidden states [N, H] of the block tokens; the worker applies the target's LM
        head to positions 1.. of each block."""
        if input_embeds is None:
            raise ValueError("the DFlash drafter has no embedding: the worker must pass "
                             "input_embeds (the target's embedding of the block)")
        # SGLang's runner passes extend embeddings as bfloat16 whatever the model dtype.
        h = input_embeds.to(self.norm.weight.dtype)
        cos, sin = self.rotary_emb(h[None], positions.view(1, -1))
        for layer in self.layers:
            h = layer(h, cos, sin, forward_batch)
        return LogitsProcessorOutput(next_token_logits=None, hidden_states=self.norm(h))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (published DFlash names; an optional "model." prefix is
        dropped) into the core's parameters; a missing, unexpected or misshapen tensor is an
        error that names it."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name.startswith("rotary_emb."):
                continue  # derived from the config
            if name not in params:
                raise ValueError(f"DFlash checkpoint tensor {name!r} has no place in this "
                                 f"drafter (its config.json describes other layers)")
            param = params[name]
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"DFlash checkpoint tensor {name} has shape "
                                 f"{tuple(tensor.shape)}, config.json implies {tuple(param.shape)}")
            param.data.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"DFlash checkpoint is missing tensors: {missing[:8]}")
        return loaded
