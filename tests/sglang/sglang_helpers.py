"""Shared pieces of the SGLang adapter tests: a tiny target/drafter pair on disk, SGLang's paged
pools on CPU, and the DFLASH worker's own KV-injection methods run against them."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MethodType, SimpleNamespace

import torch
from transformers import LlamaConfig

from dflash_plugin.checkpoint import save_drafter
from dflash_plugin.config import make_config
from dflash_plugin.drafter import DFlashDraftModel as CoreDrafter

VOCAB, HIDDEN, MASK, BLOCK = 96, 64, 95, 4


@contextmanager
def plugin_drafter_requested():
    """DFLASH_SGLANG_DRAFTER=plugin inside the block (SGLang's own drafter otherwise)."""
    name = "DFLASH_SGLANG_DRAFTER"
    saved = os.environ.get(name)
    os.environ[name] = "plugin"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name)
        else:
            os.environ[name] = saved


def build_sglang_drafter(drafter_dir: Path):
    """This adapter's drafter as SGLang builds it for `--speculative-algorithm DFLASH` with
    DFLASH_SGLANG_DRAFTER=plugin: class resolved from the checkpoint's config through SGLang's
    model loader, weights through its safetensors iterator into `load_weights` (float32)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    config = ModelConfig(str(drafter_dir), is_draft_model=True, dtype="float32",
                         speculative_algorithm="DFLASH")
    with plugin_drafter_requested():
        model_class, _ = get_model_architecture(config)
    model = model_class(config=config.hf_config, quant_config=None).eval()
    model.load_weights(safetensors_weights_iterator(
        [str(p) for p in sorted(Path(drafter_dir).glob("*.safetensors"))]))
    return model


@dataclass
class TinyPair:
    target_dir: Path   # config.json of a random Llama target (no weights: configs only)
    drafter_dir: Path  # a DFlash checkpoint (config.json + model.safetensors) for that target
    target_config: LlamaConfig


def make_tiny_pair(root: Path, *, seed: int = 0) -> TinyPair:
    target = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512)
    target.architectures = ["LlamaForCausalLM"]
    target_dir = root / "target"
    target.save_pretrained(target_dir)
    torch.manual_seed(seed)
    config = make_config(target, num_draft_layers=2, block_size=BLOCK, mask_token_id=MASK)
    drafter = CoreDrafter(config)
    with torch.no_grad():  # larger weights than the default init, so drafts depend on the input
        for param in drafter.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.3)
    drafter_dir = root / "drafter"
    save_drafter(drafter, drafter_dir, dtype=torch.float32)
    return TinyPair(target_dir, drafter_dir, target)


class PagedDraftCache:
    """SGLang's real request->slot table and per-layer KV pool on CPU, with slots handed out in
    a shuffled order (as after some allocation churn), plus the worker's KV-injection code."""

    def __init__(self, model, *, max_requests: int = 4, max_len: int = 64, seed: int = 0):
        from sglang.srt.configs.draft_parallel import DraftParallelLayout
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        attn = model.layers[0].self_attn
        size = max_requests * max_len
        self.req_to_token = ReqToTokenPool(size=max_requests, max_context_len=max_len,
                                           device="cpu", enable_memory_saver=False)
        self.kv = MHATokenToKVPool(size=size, page_size=1, dtype=torch.float32,
                                   head_num=attn.num_kv_heads, head_dim=attn.head_dim,
                                   layer_num=len(model.layers), device="cpu",
                                   enable_memory_saver=False)
        generator = torch.Generator().manual_seed(seed)
        slots = torch.randperm(size, generator=generator) + 1  # slot 0 is SGLang's padding slot
        for row in range(1, max_requests + 1):  # row 0 is the padding row
            self.req_to_token.req_to_token[row] = slots[(row - 1) * max_len:row * max_len].int()
        self.runner = SimpleNamespace(device=torch.device("cpu"),
                                      req_to_token_pool=self.req_to_token, token_to_kv_pool=self.kv)
        # The attributes of DFlashWorkerV2 that its KV-injection methods read.
        self.worker = SimpleNamespace(
            draft_model=model, draft_model_runner=self.runner, model_runner=self.runner,
            lilicorr=None, _use_fused_kv_materialize=False, _fused_kv_helper=None,
            draft_parallel_layout=DraftParallelLayout(tp_group=None, attn_tp_size=1))
        self.worker._append_target_hidden_sequential = MethodType(
            DFlashWorkerV2._append_target_hidden_sequential, self.worker)

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.req_to_token.req_to_token[row, start:end].long()

    def inject(self, target_hidden, positions, cache_loc, cache_loc_2d=None, commit_lens=None):
        """The worker's `_append_target_hidden_to_draft_kv_by_loc`, unchanged, on our model."""
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc(
            self.worker, target_hidden=target_hidden, cache_loc=cache_loc, positions=positions,
            cache_loc_2d=cache_loc_2d, commit_lens=commit_lens)

    def draft_hidden(self, model, rows, prefix_lens, block_ids, embed):
        """The draft forward as the worker runs it: a TARGET_VERIFY batch of blocks after the
        committed prefixes, through RadixAttention and the torch fallback backend."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from torch_attention import TorchDraftAttnBackend

        bs, block = block_ids.shape
        prefix = torch.tensor(prefix_lens)
        positions = (prefix[:, None] + torch.arange(block)[None]).reshape(-1)
        out_cache_loc = torch.cat([self.slots(r, p, p + block) for r, p in zip(rows, prefix_lens)])
        batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.reshape(-1),
            req_pool_indices=torch.tensor(rows), seq_lens=prefix, out_cache_loc=out_cache_loc,
            seq_lens_sum=int(prefix.sum()), seq_lens_cpu=prefix + block, positions=positions,
            input_embeds=None, spec_algorithm=SpeculativeAlgorithm.DFLASH)
        backend = TorchDraftAttnBackend(self.runner)
        with forward_context(ForwardContext(attn_backend=backend)):
            out = model.forward(batch.input_ids, positions, batch,
                                input_embeds=embed(block_ids).reshape(bs * block, -1))
        return out.hidden_states.view(bs, block, -1)
