"""CPU capability probes and the serving dtype chosen from them."""

import platform

import pytest
import torch

from dflash_plugin import cpu_features


def fake_cpu(monkeypatch, *, machine="x86_64", avx512_bf16=False, amx=False):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)


@pytest.mark.parametrize("avx512_bf16, amx, native", [(False, False, False), (True, False, True),
                                                       (False, True, True), (True, True, True)])
def test_native_bf16_on_x86_follows_the_bf16_instructions(monkeypatch, avx512_bf16, amx, native):
    fake_cpu(monkeypatch, avx512_bf16=avx512_bf16, amx=amx)
    assert cpu_features.native_bf16() is native
    assert cpu_features.default_cpu_dtype() == (None if native else "float32")


def test_unknown_where_torch_cannot_tell(monkeypatch):
    fake_cpu(monkeypatch, machine="aarch64", amx=True)
    assert cpu_features.native_bf16() is None and cpu_features.default_cpu_dtype() is None
    fake_cpu(monkeypatch)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_features.native_bf16() is None and cpu_features.default_cpu_dtype() is None


def test_this_machines_answer_matches_its_cpu_flags():
    """The probe agrees with what the kernel reports for this CPU (x86 Linux only)."""
    if platform.machine() != "x86_64":
        pytest.skip("x86 only")
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
    assert cpu_features.native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})
