"""vLLM general-plugin entry point (`[project.entry-points."vllm.general_plugins"] dflash`).

vLLM calls `register()` in every process it starts (front end, engine core, workers), without a
try, so it is cheap, idempotent and never raises. Outside SUPPORTED_VLLM (the `vllm` extra in
pyproject.toml) it logs one warning and returns: vLLM runs unchanged, native DFlash included.
Inside, it registers this project's drafter class
for the `DFlashDraftModel` architecture as a lazy "module:Class" string, and puts in place P4/P5
(vllm_ext.plain_sampling: min_p / logit_bias requests served without drafts instead of refused),
which act only on engines that run this plugin's drafter. On the CPU platform it also serves
CPython's arena blocks from malloc (H1, dflash_plugin.arena_cache; DFLASH_ARENA_CACHE=off keeps
CPython's own). When vLLM builds
a DFlash drafter, that class (vllm_ext.model) checks the draft/target pair and installs the
load-aware drafting hook (vllm_ext.patches).

Excluding the plugin (`VLLM_PLUGINS` set without "dflash") gives vLLM's native DFlash.

Environment (dflash_plugin.switches): DFLASH_VLLM_SKIP_VERSION_CHECK=on loads on a vLLM outside
SUPPORTED_VLLM (untested; the hooks are still only installed where their guards pass); the
drafting switches are read by vllm_ext.drafting.
"""

from __future__ import annotations

import logging

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dflash_plugin.switches import SwitchError, read

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

SUPPORTED_VLLM = SpecifierSet(">=0.32,<0.33")  # = the `vllm` extra; the series the tests ran on
TESTED_VLLM = ("0.32",)  # release series this plugin's tests ran against

ARCHITECTURE = "DFlashDraftModel"
MODEL_CLASS = "vllm_ext.model:DFlashVllmDrafter"

_registered = False
_declined = False  # the out-of-range warning was logged in this process


def vllm_version() -> Version:
    import vllm

    try:
        return Version(vllm.__version__)
    except InvalidVersion as err:
        raise RuntimeError(f"dflash plugin: cannot parse the vLLM version {vllm.__version__!r}; "
                           "set DFLASH_VLLM_SKIP_VERSION_CHECK=1 to load it anyway") from err


def version_is_tested(version: Version) -> bool:
    return f"{version.major}.{version.minor}" in TESTED_VLLM


def unsupported_version() -> str | None:
    """Why this plugin leaves the installed vLLM alone, or None to load (a version inside
    SUPPORTED_VLLM, or the override set)."""
    try:
        if read("DFLASH_VLLM_SKIP_VERSION_CHECK"):
            return None
    except SwitchError as err:  # register() never raises: decline, naming the variable
        return f"dflash plugin: {err}; it is not loaded and vLLM runs unchanged"
    try:
        version = vllm_version()
    except RuntimeError as err:
        return str(err)
    if not SUPPORTED_VLLM.contains(version, prereleases=True):
        return (f"dflash plugin supports vLLM {SUPPORTED_VLLM} but vLLM {version} is installed; "
                f"it is not loaded and vLLM runs unchanged (method 'dflash' gets vLLM's own "
                f"drafter). Install a supported vLLM, or set DFLASH_VLLM_SKIP_VERSION_CHECK=1 "
                f"to try it anyway")
    return None


def register():
    global _registered, _declined
    if _registered or _declined:
        return
    reason = unsupported_version()
    if reason is not None:
        _declined = True
        logger.warning(reason)
        return
    from vllm import ModelRegistry

    _enable_arena_cache()
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)  # R1
    _registered = True
    logger.debug("dflash plugin: %s -> %s", ARCHITECTURE, MODEL_CLASS)
    try:  # before any model runner exists: P5 must be in place when the runner is built
        from vllm_ext.plain_sampling import install_plain_sampling

        install_plain_sampling()
    except Exception as err:  # noqa: BLE001 (vLLM would stop; the rest of the plugin still works)
        logger.warning("dflash plugin: min_p / logit_bias requests stay refused with speculative "
                       "decoding (%s: %s)", type(err).__name__, err)


def _enable_arena_cache() -> None:
    """H1 on the CPU platform, where its gain was measured: plain and speculative servers alike
    (every vLLM process that loads the plugin), so they compare on equal terms."""
    try:
        if not read("DFLASH_ARENA_CACHE"):
            return
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from dflash_plugin.arena_cache import enable

        on, why = enable()
    except Exception as err:  # noqa: BLE001 (register() never raises: vLLM runs as without it)
        on, why = False, f"{type(err).__name__}: {err}"
    if on:
        logger.info("dflash plugin: %s (DFLASH_ARENA_CACHE)", why)
    else:
        logger.warning("dflash plugin: CPython's arena blocks stay mapped per use, which costs "
                       "speculative steps up to ~10%% on CPU: %s", why)
