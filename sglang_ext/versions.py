"""Which SGLang releases this adapter supports, and the one check every entry point makes.

The adapter plugs into SGLang's DFLASH worker (`speculative/dflash_worker_v2.py`), whose calls on
the draft model change between releases. Only releases whose worker contract the tests in
tests/sglang/ verified are accepted; after an SGLang upgrade, run those tests, then widen the range.

Reads versions from package metadata only: nothing here imports SGLang (or torch).
"""

from __future__ import annotations

import importlib.metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dflash_plugin.errors import DFlashError
from dflash_plugin.switches import read

# 0.5.23 (and its post releases) is the release the contract tests were written against; the
# registry of speculative algorithms exists from 0.5.15, the v2 DFLASH worker too.
SUPPORTED_SGLANG = SpecifierSet(">=0.5.23,<0.5.24")
TESTED_SGLANG = "0.5.23"
SETUP_HINT = "scripts/setup_sglang_env.sh creates .venv-sglang with sglang==" + TESTED_SGLANG


class SGLangVersionError(DFlashError):
    """SGLang is missing, or a release this adapter was not verified against."""


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str | None:
    """Return the installed SGLang version if supported; raise SGLangVersionError otherwise.

    With DFLASH_SGLANG_ALLOW_UNTESTED=1 an unsupported version is returned and the caller
    decides how loudly to warn; a missing SGLang is always an error.
    """
    version = installed_sglang_version() if version is None else version
    if version is None:
        raise SGLangVersionError(f"SGLang is not installed in this Python environment; "
                                 f"{SETUP_HINT}")
    # DFLASH_SGLANG_ALLOW_UNTESTED=1 runs an unlisted SGLang (a dev build, a newer release);
    # the contract tests then say whether the worker still fits.
    if is_supported(version) or read("DFLASH_SGLANG_ALLOW_UNTESTED"):
        return version
    raise SGLangVersionError(
        f"SGLang {version} is not supported by dflash-plugin's SGLang adapter (supported: "
        f"sglang{SUPPORTED_SGLANG}); {SETUP_HINT}, or set DFLASH_SGLANG_ALLOW_UNTESTED=1 to try it anyway")


def is_supported(version: str) -> bool:
    """Post releases and local builds inside the range count (0.5.23.post1, 0.5.23+cu130)."""
    try:
        return SUPPORTED_SGLANG.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False
