"""What this CPU computes natively, for the choices that depend on it: the serving dtype and the
draft policy's cost preset.

bfloat16 is only fast on CPUs with bf16 dot-product instructions (x86 AVX512-BF16 or AMX). Without
them (e.g. AVX2-only x86 servers) PyTorch and oneDNN convert every bf16 operand, so a bf16 target
step is slower than a float32 one and verifying drafts costs nearly a plain step per token:
speculation cannot pay (docs/history.md, "CPUs without native bf16"). vLLM's CPU platform lists
bf16 as supported on every x86 CPU and keeps a bf16 model in bf16.
"""

from __future__ import annotations

import platform

import torch


def _probe(name: str) -> bool | None:
    """PyTorch's answer to one x86 feature probe of torch.cpu; None where it has none (not x86,
    or a PyTorch without that probe)."""
    probe = getattr(torch.cpu, name, None)
    if platform.machine().lower() not in ("x86_64", "amd64") or not callable(probe):
        return None
    return bool(probe())


def native_bf16() -> bool | None:
    """True/False where PyTorch can tell whether this CPU has bf16 dot-product instructions; None
    where it cannot (not x86, or a PyTorch without the probes): callers then keep their default."""
    answers = [_probe(name) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return None if None in answers else any(answers)


def default_cpu_dtype() -> str | None:
    """The dtype to run a model in on this CPU when the user chose none: "float32" where the CPU
    is known to lack native bf16 (float16 is no faster there); None (keep the model's or the
    engine's choice) otherwise."""
    return "float32" if native_bf16() is False else None

