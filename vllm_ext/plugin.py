"""vLLM general-plugin entry point (`[project.entry-points."vllm.general_plugins"] dflash`).

vLLM calls `register()` in every process it starts (front end, engine core, workers), so it is
cheap and idempotent. It checks the vLLM version, then registers this project's drafter class
for the `DFlashDraftModel` architecture as a lazy "module:Class" string: nothing else is
imported, and nothing changes for requests that do not use `method: "dflash"`. When vLLM builds
a DFlash drafter, that class (vllm_ext.model) checks the draft/target pair and installs the
load-aware drafting hook (vllm_ext.patches).

Excluding the plugin (`VLLM_PLUGINS` set without "dflash") gives vLLM's native DFlash.

Environment:
  DFLASH_VLLM_SKIP_VERSION_CHECK=1   run on a vLLM outside SUPPORTED_VLLM (untested; the hook
                                     is still only installed where its guards pass)
  DFLASH_DRAFT_POLICY, DFLASH_COST_MODEL   see vllm_ext.drafting
"""

from __future__ import annotations

import logging
import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

SUPPORTED_VLLM = SpecifierSet(">=0.25,<0.34")  # DFlash on CPU exists from 0.25
TESTED_VLLM = ("0.32",)  # release series this plugin's tests ran against
SKIP_VERSION_CHECK_ENV = "DFLASH_VLLM_SKIP_VERSION_CHECK"

ARCHITECTURE = "DFlashDraftModel"
MODEL_CLASS = "vllm_ext.model:DFlashVllmDrafter"

_registered = False


def vllm_version() -> Version:
    import vllm

    try:
        return Version(vllm.__version__)
    except InvalidVersion as err:
        raise RuntimeError(f"dflash plugin: cannot parse the vLLM version {vllm.__version__!r}; "
                           f"set {SKIP_VERSION_CHECK_ENV}=1 to load it anyway") from err


def version_is_tested(version: Version) -> bool:
    return f"{version.major}.{version.minor}" in TESTED_VLLM


def check_vllm_version():
    """Refuse a vLLM outside SUPPORTED_VLLM unless the override is set."""
    if os.environ.get(SKIP_VERSION_CHECK_ENV) == "1":
        return
    version = vllm_version()
    if not SUPPORTED_VLLM.contains(version, prereleases=True):
        raise RuntimeError(
            f"dflash plugin supports vLLM {SUPPORTED_VLLM} but vLLM {version} is installed. "
            f"Install a supported vLLM, exclude the plugin with VLLM_PLUGINS (a comma list "
            f"without 'dflash'), or set {SKIP_VERSION_CHECK_ENV}=1 to try it anyway.")


def register():
    global _registered
    if _registered:
        return
    check_vllm_version()
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _registered = True
    logger.debug("dflash plugin: %s -> %s", ARCHITECTURE, MODEL_CLASS)
