"""The plugin's registration, version guard and patch guards (no engine started)."""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = pytest.mark.vllm


@pytest.fixture
def fresh_plugin(monkeypatch):
    from vllm_ext import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.delenv(plugin.SKIP_VERSION_CHECK_ENV, raising=False)
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


def test_unsupported_vllm_is_refused_by_name(fresh_plugin, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.35.1")
    with pytest.raises(RuntimeError, match=r"supports vLLM .*<0.34.* but vLLM 0.35.1 is installed"):
        fresh_plugin.register()
    monkeypatch.setenv(fresh_plugin.SKIP_VERSION_CHECK_ENV, "1")
    fresh_plugin.register()


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
