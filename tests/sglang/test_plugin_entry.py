"""The plugin as SGLang loads it: entry point, hook, model registry; version refusal; opt-out."""

from __future__ import annotations

import importlib.metadata

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from dflash_plugin.errors import DFlashError  # noqa: E402
from sglang_ext import launch_server, plugin, registration, versions  # noqa: E402
from sglang_ext.draft_model import DFlashDraftModel  # noqa: E402


def test_entry_point_is_declared():
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")
           if ep.name == plugin.PLUGIN_NAME]
    assert [ep.value for ep in eps] == ["sglang_ext.plugin:register"]
    assert eps[0].load() is plugin.register


def test_sglang_loads_the_plugin_and_resolves_dflash_as_asked(tiny, plugins_loaded, monkeypatch):
    """SGLang's own drafter by default; this adapter's with DFLASH_SGLANG_DRAFTER=plugin; SGLang's
    again once the next draft model does not ask for it."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.models import dflash as sglang_dflash
    from sglang.srt.models.registry import ModelRegistry

    assert registration.RESOLVER in HookRegistry._patched
    config = ModelConfig(str(tiny.drafter_dir), is_draft_model=True,
                         speculative_algorithm="DFLASH")
    assert get_model_architecture(config) == (sglang_dflash.DFlashDraftModel, "DFlashDraftModel")
    monkeypatch.setenv("DFLASH_SGLANG_DRAFTER", "plugin")
    assert get_model_architecture(config) == (DFlashDraftModel, "DFlashDraftModel")
    assert ModelRegistry.models["DFlashDraftModel"] is DFlashDraftModel
    # Other architectures still resolve to SGLang's own classes.
    assert ModelRegistry.models["LlamaForCausalLM"].__module__.startswith("sglang.srt.models")
    monkeypatch.delenv("DFLASH_SGLANG_DRAFTER")
    assert get_model_architecture(config)[0] is sglang_dflash.DFlashDraftModel


def test_unknown_drafter_choice_is_named(tiny, plugins_loaded, monkeypatch):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    monkeypatch.setenv("DFLASH_SGLANG_DRAFTER", "ours")
    config = ModelConfig(str(tiny.drafter_dir), is_draft_model=True,
                         speculative_algorithm="DFLASH")
    with pytest.raises(DFlashError, match="DFLASH_SGLANG_DRAFTER='ours': expected one of native"):
        get_model_architecture(config)


def test_register_is_idempotent(plugins_loaded):
    hooks = len(HookRegistry._hooks[registration.RESOLVER])
    plugin.register()
    plugin.register()
    assert len(HookRegistry._hooks[registration.RESOLVER]) == hooks
    assert registration.register_draft_model() is registration.register_draft_model()


@pytest.fixture
def fresh_plugin(monkeypatch):
    """register() as in a new process, recording instead of installing the hook."""
    installed = []
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(registration, "install", lambda: installed.append(True))
    return installed


def test_opt_out_leaves_sglang_alone(fresh_plugin, monkeypatch):
    monkeypatch.setenv("DFLASH_SGLANG_PLUGIN", "0")
    plugin.register()
    assert fresh_plugin == []


@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0"])
def test_unsupported_sglang_is_refused_by_name(fresh_plugin, monkeypatch, version):
    monkeypatch.setattr(versions, "installed_sglang_version", lambda: version)
    with pytest.raises(versions.SGLangVersionError, match=f"SGLang {version} is not supported"):
        plugin.register()
    assert fresh_plugin == []
    monkeypatch.setenv("DFLASH_SGLANG_ALLOW_UNTESTED", "1")
    plugin.register()  # the escape hatch for dev builds: warns and registers
    assert fresh_plugin == [True]


def test_missing_sglang_is_named(monkeypatch):
    monkeypatch.setattr(versions, "installed_sglang_version", lambda: None)
    with pytest.raises(versions.SGLangVersionError, match="SGLang is not installed"):
        versions.check_sglang_version()


def test_installed_sglang_is_supported():
    assert versions.is_supported(importlib.metadata.version("sglang"))


def test_launcher_stops_on_refusal_before_sglang_starts(fresh_plugin, monkeypatch, capsys):
    monkeypatch.setattr(launch_server.sys, "argv", list(launch_server.sys.argv))
    monkeypatch.setattr(versions, "installed_sglang_version", lambda: "0.4.9")
    started = []
    monkeypatch.setattr(launch_server.runpy, "run_module", lambda *a, **k: started.append(a))
    assert launch_server.main(["--model-path", "x"]) == 2
    assert "SGLang 0.4.9 is not supported" in capsys.readouterr().err
    assert started == []


def test_launcher_runs_sglang_launch_server_with_the_plugin_allowed(fresh_plugin, monkeypatch):
    monkeypatch.setattr(launch_server.sys, "argv", list(launch_server.sys.argv))
    started = []
    monkeypatch.setattr(launch_server.runpy, "run_module",
                        lambda name, **kw: started.append((name, launch_server.sys.argv[1:])))
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    assert launch_server.main(["--model-path", "m", "--port", "9"]) == 0
    assert started == [("sglang.launch_server", ["--model-path", "m", "--port", "9"])]
    assert launch_server.os.environ["SGLANG_PLUGINS"] == "other,dflash"
    assert fresh_plugin == [True]


@pytest.mark.slow  # a fresh interpreter importing SGLang's server: ~100 s on a busy 2-core CPU
def test_launch_runs_sglang_through_the_checking_launcher(tmp_path):
    """`launch()` in a real subprocess of this environment: the launcher registers the plugin,
    then hands the arguments to `sglang.launch_server` (here `--help`, which exits at once)."""
    import sys

    from sglang_ext.server_args import launch

    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        code = launch({"model_path": "unused"}, ["--help"], python=sys.executable,
                      stdout=stream)
    assert code == 0
    assert "--speculative-draft-model-path" in out.read_text()
