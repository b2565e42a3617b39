"""What the plugin registers in SGLang, through SGLang's own registries and plugin hooks only.

* Model registry: `DFlashDraftModel`, the architecture name of published DFlash checkpoints,
  resolves to sglang_ext.draft_model.DFlashDraftModel. SGLang's DFLASH worker loads its draft
  model through this registry, so `--speculative-algorithm DFLASH` runs this project's drafter
  with all of SGLang's DFLASH plumbing (target feature capture, paged draft KV, verify, overlap).
  Registering means importing every SGLang model (~30 s on a busy 2-core CPU), which only the
  processes that load a model need: a BEFORE hook (SGLang's HookRegistry) on
  `get_model_architecture`, the one function that resolves model classes, registers on first use.
* Speculative-algorithm registry (SGLang >= 0.5.15): built-in names such as DFLASH are reserved
  there, so DFLASH is taken over through the model registry above; new algorithm names (a draft-
  tree worker, say) belong in `install` through `SpeculativeAlgorithm.register`.

Every step first checks that the SGLang names it relies on exist, and fails naming them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

from dflash_plugin.errors import DFlashError

logger = logging.getLogger(__name__)

MODELS_PACKAGE = "sglang_ext.models"
ARCHITECTURE = "DFlashDraftModel"
RESOLVER = "sglang.srt.model_loader.utils.get_model_architecture"
REQUIRED_MODULES = ("sglang.srt.speculative.dflash_worker_v2", "sglang.srt.model_loader.utils",
                    "sglang.srt.models.registry", "sglang.srt.plugins.hook_registry")

_draft_model_class = None


class SGLangContractError(DFlashError):
    """The installed SGLang lacks something this adapter registers through."""


def _require(obj, attribute: str, where: str):
    value = getattr(obj, attribute, None)
    if value is None:
        raise SGLangContractError(f"this SGLang has no {where}.{attribute}, which dflash-plugin's "
                                  "adapter needs (supported releases: sglang_ext.versions)")
    return value


def install() -> None:
    """Check what the adapter relies on and register the hook; imports no model code."""
    for module in REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            raise SGLangContractError(f"this SGLang has no module {module}, which dflash-plugin's "
                                      "adapter needs (supported releases: sglang_ext.versions)")
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    registry = _require(hooks, "HookRegistry", "sglang.srt.plugins.hook_registry")
    hook_type = _require(_require(hooks, "HookType", "sglang.srt.plugins.hook_registry"),
                         "BEFORE", "HookType")
    registry.register(RESOLVER, _before_model_resolution, hook_type)


def _before_model_resolution(*args, **kwargs):
    register_draft_model()
    return None  # arguments unchanged


def register_draft_model() -> type:
    """Point the DFlash draft architecture at this project's drafter (once); returns the class."""
    global _draft_model_class
    if _draft_model_class is not None:
        return _draft_model_class
    registry_module = importlib.import_module("sglang.srt.models.registry")
    registry = _require(registry_module, "ModelRegistry", "sglang.srt.models.registry")
    _require(registry, "register", "ModelRegistry")(MODELS_PACKAGE, overwrite=True, strict=True)
    from sglang_ext.draft_model import DFlashDraftModel

    resolved = registry.models.get(ARCHITECTURE)
    if resolved is not DFlashDraftModel:
        raise SGLangContractError(f"ModelRegistry.register did not install {ARCHITECTURE} "
                                  f"(it resolves to {resolved!r})")
    logger.info("dflash-plugin: draft architecture %s -> %s.%s", ARCHITECTURE,
                DFlashDraftModel.__module__, DFlashDraftModel.__qualname__)
    _draft_model_class = DFlashDraftModel
    return DFlashDraftModel
