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
    assert cpu_features.has_amx() is amx


def test_unknown_where_torch_cannot_tell(monkeypatch):
    fake_cpu(monkeypatch, machine="aarch64", amx=True)
    assert cpu_features.native_bf16() is None and cpu_features.default_cpu_dtype() is None
    assert cpu_features.has_amx() is False
    fake_cpu(monkeypatch)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_features.native_bf16() is None and cpu_features.default_cpu_dtype() is None
    assert cpu_features.has_amx() is False


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


ZEN5 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
ZEN4 = ZEN5.replace(": 26", ": 25")
XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\n"
XEON_207 = XEON.replace(": 167", ": 207")


def test_vendor_and_family_come_from_cpuinfo():
    assert cpu_features.x86_cpu_id(ZEN5) == ("AuthenticAMD", 26, 2)
    assert cpu_features.x86_cpu_id(XEON) == ("GenuineIntel", 6, 167)
    no_model = XEON.replace("model\t\t: 167\n", "")
    assert cpu_features.x86_cpu_id(no_model) == ("GenuineIntel", 6, None)
    assert cpu_features.x86_cpu_id("processor\t: 0\nBogoMIPS\t: 50.00\n") is None


@pytest.mark.parametrize("cpuinfo, amx, why", [
    (XEON, True, "a CPU with AMX"), (ZEN5, False, "an AMD CPU of family 26 (Zen 5)"),
    (ZEN4, False, None), (XEON, False, None), ("", False, None),
    (XEON_207, False, "an Intel Xeon of family 6 model 207")])
def test_every_core_where_it_measured_faster(monkeypatch, cpuinfo, amx, why):
    fake_cpu(monkeypatch, avx512_bf16=True, amx=amx)
    read = cpu_features.x86_cpu_id
    monkeypatch.setattr(cpu_features, "x86_cpu_id", lambda: read(cpuinfo))
    assert cpu_features.faster_on_every_core() == why
