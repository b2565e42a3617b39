"""SGLang general-plugin entry point: `sglang.srt.plugins: dflash = sglang_ext.plugin:register`.

SGLang calls `register()` early in every process it starts (launcher, scheduler, detokenizer) when
this package is installed and the plugin is allowed (`SGLANG_PLUGINS` unset, or naming `dflash`).
It is cheap until it has something to do, checks the SGLang version before touching SGLang, runs
once per process, and only then imports the adapter (sglang_ext.registration).

SGLang's own DFlash drafter serves DFlash checkpoints unless DFLASH_SGLANG_DRAFTER=plugin asks for
this adapter's (sglang_ext.registration); DFLASH_SGLANG_PLUGIN=0 keeps the package installed but
loads nothing at all. Note that SGLang logs and then ignores an exception raised by a plugin; the launcher
(`python -m sglang_ext.launch_server`, used by `dflash serve --engine sglang`) calls `register()`
itself first, so there a refusal stops the server instead.
"""

from __future__ import annotations

import logging

from dflash_plugin.switches import read
from sglang_ext.versions import TESTED_SGLANG, check_sglang_version, is_supported

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dflash"  # the entry point's name, as listed in SGLANG_PLUGINS

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    if not enabled():
        logger.info("dflash-plugin: DFLASH_SGLANG_PLUGIN=off, not loaded")
        return
    version = check_sglang_version()  # SGLangVersionError names the supported range
    if not is_supported(version):
        logger.warning("dflash-plugin: SGLang %s is untested (tested: %s); continuing because "
                       "DFLASH_SGLANG_ALLOW_UNTESTED=1", version, TESTED_SGLANG)
    from sglang_ext import registration

    registration.install()
    _registered = True


def enabled() -> bool:
    """DFLASH_SGLANG_PLUGIN (default on); a bad value raises SwitchError naming it."""
    return read("DFLASH_SGLANG_PLUGIN")
