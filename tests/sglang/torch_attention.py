"""A plain-torch attention backend for the drafter's TARGET_VERIFY batches: the reference the
CPU tests run the SGLang drafter on (SGLang's DFLASH refuses device cpu, and its torch_native
backend has no TARGET_VERIFY path).

It follows the contract of SGLang's GPU backends for a draft block: the batch's queries are
`bs` blocks of equal length; `forward_batch.seq_lens` are the committed context lengths (the
block comes after them); the block's K/V are written at `out_cache_loc`; request i's keys are
the pool slots `req_to_token[req_pool_indices[i], : seq_lens[i] + block]`. ENCODER_ONLY layers
(DFlash) see all of them; DECODER layers add the causal mask inside the block.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc


class TorchDraftAttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool

    def init_forward_metadata(self, forward_batch):
        pass  # everything is read from the batch and the pools in forward_extend

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        raise NotImplementedError("TorchDraftAttnBackend runs draft blocks (TARGET_VERIFY) only")

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if not forward_batch.forward_mode.is_target_verify():
            raise NotImplementedError("TorchDraftAttnBackend runs draft blocks (TARGET_VERIFY) "
                                      f"only, not {forward_batch.forward_mode}")
        pool = self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, physical=True),
                               k, v, layer.k_scale, layer.v_scale)
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        q = q.view(-1, heads, layer.qk_head_dim)
        bs = forward_batch.batch_size
        block = q.shape[0] // bs
        keys_all = pool.get_key_buffer(layer.layer_id)  # [slots, kv_heads, hd]
        values_all = pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        out = q.new_empty(q.shape[0], heads, layer.v_head_dim)
        rows = forward_batch.req_pool_indices.tolist()
        for i, (row, prefix) in enumerate(zip(rows, forward_batch.seq_lens.tolist())):
            slots = req_to_token[row, : prefix + block].long()
            keys = keys_all[slots].to(q.dtype).transpose(0, 1)[None]  # [1, kv_heads, L, hd]
            values = values_all[slots].to(q.dtype).transpose(0, 1)[None]
            queries = q[i * block:(i + 1) * block].transpose(0, 1)[None]  # [1, heads, B, hd]
            mask = None
            if layer.attn_type == AttentionType.DECODER:
                key_pos = torch.arange(prefix + block, device=q.device)
                mask = key_pos[None, :] <= prefix + torch.arange(block, device=q.device)[:, None]
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                               scale=layer.scaling, enable_gqa=heads != kv_heads)
            out[i * block:(i + 1) * block] = o[0].transpose(0, 1)
        return out.view(q.shape[0], heads * layer.v_head_dim)
