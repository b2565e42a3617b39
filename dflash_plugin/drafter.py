"""The DFlash drafter: a few Qwen3-style layers that fill in a whole block in one forward pass.

It has no embedding or LM head of its own (it borrows the target's). Target hidden states of
several layers are fused once (`fc` + `hidden_norm`) and injected into every layer as extra
keys/values ("KV injection"): each layer projects the fused context with its own k/v weights,
k-norm and RoPE at the context's absolute positions; the context never becomes a query.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from dflash_plugin.config import dflash_fields
from dflash_plugin.layout import BlockwiseMask


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, t, hd]; cos/sin [b, t, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DraftContextCache:
    """Per-layer K/V of the committed context (RoPE applied). Block K/V are never cached, so
    the cache holds only verified tokens and needs no rollback beyond `crop`."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append new context K/V [b, kv_heads, t, hd] to a layer and return its full K/V."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def crop(self, length: int):
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :length], v[:, :, :length]


class DraftAttention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=config.attention_bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V [b, kv_heads, t, hd] for inputs x [b, t, H]: k-norm, then RoPE."""
        k = self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(x), self.num_kv_heads).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x, context, rope_block, rope_ctx, cache: DraftContextCache | None,
                layer_idx: int, attn_mask: torch.Tensor | None):
        q = self.q_norm(self._heads(self.q_proj(x), self.num_heads)).transpose(1, 2)
        q = apply_rope(q, *rope_block)
        k_ctx, v_ctx = self.project_kv(context, *rope_ctx)
        if cache is not None:
            k_ctx, v_ctx = cache.extend(layer_idx, k_ctx, v_ctx)
        k_blk, v_blk = self.project_kv(x, *rope_block)
        if isinstance(attn_mask, BlockwiseMask):
            out = self._blockwise_attention(q, k_ctx, v_ctx, k_blk, v_blk, attn_mask)
        else:
            k = torch.cat([k_ctx, k_blk], dim=2)
            v = torch.cat([v_ctx, v_blk], dim=2)
            # No causal mask: the block is bidirectional and sees all committed context.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                 enable_gqa=self.num_heads != self.num_kv_heads)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


    def _blockwise_attention(self, q, k_ctx, v_ctx, k_blk, v_blk, mask: BlockwiseMask):
        """Training attention of many blocks at once (see layout.BlockwiseMask): one softmax
        over [visible context keys, own-block keys], never scoring pairs of different blocks."""
        group = self.num_heads // self.num_kv_heads
        k_ctx, v_ctx, k_blk, v_blk = (x.repeat_interleave(group, dim=1)
                                      for x in (k_ctx, v_ctx, k_blk, v_blk))
        b, h, t, d = q.shape
        size = mask.block_size
        scale = d ** -0.5
        ctx_scores = (q @ k_ctx.transpose(-1, -2)).float() * scale
        ctx_scores = ctx_scores.masked_fill(~mask.context_visible, float("-inf"))
        q_blocks = q.view(b, h, t // size, size, d)
        k_blocks = k_blk.view(b, h, t // size, size, d)
        blk_scores = (q_blocks @ k_blocks.transpose(-1, -2)).float().view(b, h, t, size) * scale
        probs = torch.softmax(torch.cat([ctx_scores, blk_scores], dim=-1), dim=-1).to(q.dtype)
        ctx_probs, blk_probs = probs.split([k_ctx.shape[2], size], dim=-1)
        v_blocks = v_blk.view(b, h, t // size, size, d)
        blk_out = (blk_probs.view(b, h, t // size, size, size) @ v_blocks).view(b, h, t, d)
        return ctx_probs @ v_ctx + blk_out


class DraftDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = DraftAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, context, rope_block, rope_ctx, cache, layer_idx, attn_mask):
        # The context skips the input norm: it was normed once by `hidden_norm`.
        h = h + self.self_attn(self.input_layernorm(h), context, rope_block, rope_ctx, cache,
                               layer_idx, attn_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(nn.Module):
    """Parameter names match the published checkpoints: `layers.*`, `fc`, `hidden_norm`, `norm`,
    plus `lm_head` and `d2t` only for a reduced draft vocabulary."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.fields = dflash_fields(config)
        hidden = config.hidden_size
        self.layers = nn.ModuleList(DraftDecoderLayer(config) for _ in range(config.num_hidden_layers))
        num_features = len(self.fields.target_layer_ids)
        self.fc = nn.Linear(num_features * self.fields.target_hidden_size, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        vocab = self.fields.draft_vocab_size
        if vocab is not None and vocab != config.vocab_size:
            # Reduced draft vocabulary (vLLM's format): own head rows and draft->target offsets.
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.long))
        else:
            self.lm_head = None
            self.d2t = None

    def _apply(self, fn, recurse=True):
        # Keep the RoPE frequencies in float32 whatever the weights are cast to, as Hugging
        # Face's from_pretrained does for the target: bf16 frequencies shift rotation angles
        # (~0.1 rad at position 1000) away from the target's and the released drafters'.
        frequencies = dict(self.rotary_emb.named_buffers(recurse=False))
        super()._apply(fn, recurse)
        for name, original in frequencies.items():
            moved = getattr(self.rotary_emb, name)
            if moved.dtype != original.dtype:
                setattr(self.rotary_emb, name, original.to(moved.device))
        return self

    @property
    def block_size(self) -> int:
        return self.fields.block_size

    @property
    def mask_token_id(self) -> int:
        return self.fields.mask_token_id

    def new_cache(self) -> DraftContextCache:
        return DraftContextCache(len(self.layers))

    def fuse_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [b, t, n_feat*H_t] -> fused context [b, t, H]."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, block_embeds: torch.Tensor, context: torch.Tensor,
                block_positions: torch.Tensor, context_positions: torch.Tensor,
                cache: DraftContextCache | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [b, q, H] (after the final norm) for the block tokens.

        block_embeds [b, q, H]: target embeddings of the block tokens.
        context [b, c, H]: fused context not yet in `cache` (may be empty, c = 0).
        block_positions [b, q] / context_positions [b, c]: absolute positions.
        attn_mask: optional boolean [q, cached + c + q], or a layout.BlockwiseMask (training);
        None = see everything.
        """
        rope_block = self.rotary_emb(block_embeds, block_positions)
        rope_ctx = self.rotary_emb(context, context_positions)
        h = block_embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, context, rope_block, rope_ctx, cache, i, attn_mask)
        return self.norm(h)

    def draft_logits(self, hidden: torch.Tensor, target_lm_head: nn.Module) -> torch.Tensor:
        """Logits over the draft vocabulary (the target's, unless reduced)."""
        head = self.lm_head if self.lm_head is not None else target_lm_head
        return head(hidden)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity for the full vocabulary)."""
        if self.d2t is None:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]
