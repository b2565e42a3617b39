"""What the plugin registers in SGLang, through SGLang's own registries and plugin hooks only.

* Model registry: SGLang's own DFlash drafter stays in charge of `DFlashDraftModel` checkpoints.
  This adapter's drafter (sglang_ext.draft_model) drafts the same tokens and adds nothing SGLang's
  lacks (on SGLang it has neither the reduced draft vocabulary nor load-aware drafting), so it
  serves a checkpoint only when asked for (DFLASH_SGLANG_DRAFTER=plugin) and only where it can:
  tensor parallelism, quantization, sliding-window layers, reduced vocabularies and the DFlash2 /
  Domino families always stay with SGLang's (logged once, never refused). The choice is made per
  draft model in a BEFORE hook (SGLang's HookRegistry) on `get_model_architecture`, the one
  function that resolves model classes; it is also where registering happens, since that imports
  every SGLang model (~30 s on a busy 2-core CPU), which only the processes that load a model
  need.
* Speculative-algorithm registry (SGLang >= 0.5.15): built-in names such as DFLASH are reserved
  there, so DFLASH is taken over through the model registry above; new algorithm names (a draft-
  tree worker, say) belong in `install` through `SpeculativeAlgorithm.register`.

Every step first checks that the SGLang names it relies on exist, and fails naming them. Both
registrations are entries of docs/engine-ledger.md: R2 (the model registry) and R3 (the hook).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

from dflash_plugin.errors import DFlashError
from dflash_plugin.switches import read

logger = logging.getLogger(__name__)

MODELS_PACKAGE = "sglang_ext.models"
ARCHITECTURE = "DFlashDraftModel"
NATIVE_MODULE = "sglang.srt.models.dflash"  # SGLang's own class for ARCHITECTURE
RESOLVER = "sglang.srt.model_loader.utils.get_model_architecture"
REQUIRED_MODULES = ("sglang.srt.speculative.dflash_worker_v2", "sglang.srt.model_loader.utils",
                    "sglang.srt.models.registry", "sglang.srt.plugins.hook_registry")

_announced: set[str] = set()  # the reasons already logged in this process


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
    registry.register(RESOLVER, _before_model_resolution, hook_type)  # R3


def _before_model_resolution(*args, **kwargs):
    model_config = args[0] if args else kwargs.get("model_config")
    architectures = getattr(getattr(model_config, "hf_config", None), "architectures", None)
    if ARCHITECTURE in (architectures or ()):
        choose_draft_model(model_config)
    return None  # arguments unchanged


def requested_drafter(environ=os.environ) -> str:
    """DFLASH_SGLANG_DRAFTER: "native" (the default) or "plugin"."""
    return read("DFLASH_SGLANG_DRAFTER", environ)


def native_reasons(model_config, tp_size: int | None = None) -> list[str]:
    """Why SGLang's own drafter serves this draft model ([]: this adapter's serves it)."""
    if requested_drafter() == "native":
        return ["this adapter's drafter adds nothing it lacks (DFLASH_SGLANG_DRAFTER=plugin "
                "selects it)"]
    from sglang_ext.draft_model import unsupported_settings

    return unsupported_settings(model_config.hf_config, getattr(model_config, "quantization", None),
                                tp_size)


def choose_draft_model(model_config, tp_size: int | None = None) -> type:
    """Point ARCHITECTURE at this adapter's drafter or at SGLang's own for this draft model;
    returns the class."""
    reasons = native_reasons(model_config, tp_size)
    if not reasons:
        return register_draft_model()
    native = _native_draft_model()
    registry = _registry()
    if registry.models.get(ARCHITECTURE) is not native:
        registry.models[ARCHITECTURE] = native  # an earlier draft model here took it over
    message = "; ".join(reasons)
    if message not in _announced:
        _announced.add(message)
        logger.info("dflash-plugin: SGLang's own DFlash drafter serves %s: %s",
                    getattr(model_config, "model_path", "the draft model"), message)
    return native


def _registry():
    registry_module = importlib.import_module("sglang.srt.models.registry")
    return _require(registry_module, "ModelRegistry", "sglang.srt.models.registry")


def _native_draft_model() -> type:
    return _require(importlib.import_module(NATIVE_MODULE), ARCHITECTURE, NATIVE_MODULE)


def register_draft_model() -> type:
    """Point the DFlash draft architecture at this project's drafter; returns the class."""
    from sglang_ext.draft_model import DFlashDraftModel

    registry = _registry()
    if registry.models.get(ARCHITECTURE) is DFlashDraftModel:
        return DFlashDraftModel
    _native_draft_model()  # SGLang's own registered first, so it can be put back
    # R2: overwrite=True replaces SGLang's own entry for ARCHITECTURE
    _require(registry, "register", "ModelRegistry")(MODELS_PACKAGE, overwrite=True, strict=True)
    resolved = registry.models.get(ARCHITECTURE)
    if resolved is not DFlashDraftModel:
        raise SGLangContractError(f"ModelRegistry.register did not install {ARCHITECTURE} "
                                  f"(it resolves to {resolved!r})")
    logger.info("dflash-plugin: draft architecture %s -> %s.%s", ARCHITECTURE,
                DFlashDraftModel.__module__, DFlashDraftModel.__qualname__)
    return DFlashDraftModel
