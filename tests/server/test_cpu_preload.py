"""LD_PRELOAD for vLLM-CPU servers: what is found, the switch, and how dflash serve uses it."""

import pytest

from dflash_plugin.errors import DFlashError
from dflash_cli.serving import flags
from dflash_cli.serving.cpu_preload import cpu_preload, preload_enabled


def _libs(tmp_path, iomp=True, tcmalloc=True):
    prefix, system = tmp_path / "venv", tmp_path / "usr_lib"
    (prefix / "lib").mkdir(parents=True)
    system.mkdir()
    if iomp:
        (prefix / "lib" / "libiomp5.so").write_bytes(b"")
    if tcmalloc:
        (system / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return str(prefix), (str(system),)


def test_preload_lists_tcmalloc_then_intel_openmp(tmp_path):
    prefix, dirs = _libs(tmp_path)
    assert cpu_preload({}, prefix, dirs) == (f"{dirs[0]}/libtcmalloc_minimal.so.4:"
                                             f"{prefix}/lib/libiomp5.so")


def test_preload_takes_what_it_finds_and_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    prefix, dirs = _libs(tmp_path, tcmalloc=False)
    assert cpu_preload({}, prefix, dirs) == f"{prefix}/lib/libiomp5.so"
    prefix, dirs = _libs(tmp_path / "none", iomp=False, tcmalloc=False)
    assert cpu_preload({}, prefix, dirs) is None
    prefix, dirs = _libs(tmp_path / "off")
    assert cpu_preload({"DFLASH_CPU_PRELOAD": "off"}, prefix, dirs) is None
    with pytest.raises(ValueError, match="DFLASH_CPU_PRELOAD"):
        preload_enabled({"DFLASH_CPU_PRELOAD": "maybe"})


def test_serve_preloads_on_the_cpu_build_unless_told_not_to(monkeypatch):
    monkeypatch.setattr(flags, "cpu_preload", lambda env: None
                        if env.get("DFLASH_CPU_PRELOAD") == "off" else "/x/libiomp5.so")
    opts = flags.ServeOptions(model_path="/m", speculative_algorithm="NONE")
    assert flags._default_env(opts, cpu=True)["LD_PRELOAD"] == "/x/libiomp5.so"
    assert "LD_PRELOAD" not in flags._default_env(opts, cpu=False)
    off = flags.ServeOptions(model_path="/m", speculative_algorithm="NONE",
                             env={"DFLASH_CPU_PRELOAD": "off"})
    assert "LD_PRELOAD" not in flags._default_env(off, cpu=True)
    # The caller's own LD_PRELOAD wins over the default (defaults < environment < YAML env).
    launch = flags.Launch(["x"], flags._default_env(opts, cpu=True), {}, "h", 1, "m")
    assert launch.environ({"LD_PRELOAD": "/mine.so"})["LD_PRELOAD"] == "/mine.so"


def test_a_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DFLASH_CPU_PRELOAD", "sometimes")
    with pytest.raises(DFlashError, match="DFLASH_CPU_PRELOAD"):
        flags._default_env(flags.ServeOptions(model_path="/m"), cpu=True)
