"""Tests of the SGLang adapter against the real installed sglang package. They run in the SGLang
environment (scripts/setup_sglang_env.sh):

    .venv-sglang/bin/python -m pytest tests/sglang

Elsewhere (the vLLM environment has no sglang) every module here skips at import. They import
`sglang.srt`, never bare `sglang`: with tests/ on sys.path, this folder itself would pass for a
(namespace) package of that name.

Only this project's plugin may run: other installed `sglang.srt.plugins` entry points could hook
the same functions, so SGLANG_PLUGINS is pinned before SGLang is imported.
"""

from __future__ import annotations

import importlib.metadata
import os

try:
    importlib.metadata.version("sglang")
    HAVE_SGLANG = True
except importlib.metadata.PackageNotFoundError:
    HAVE_SGLANG = False

if HAVE_SGLANG:
    os.environ["SGLANG_PLUGINS"] = "dflash"
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # breaks importing the DFLASH worker
    os.environ.pop("DFLASH_SGLANG_PLUGIN", None)
    os.environ.pop("DFLASH_SGLANG_DRAFTER", None)
    os.environ.pop("DFLASH_SGLANG_ALLOW_UNTESTED", None)

import pytest  # noqa: E402
import torch  # noqa: E402

# As in tests/conftest.py (not loaded here, see pytest.ini): one thread is far faster on a small
# shared CPU.
torch.set_num_threads(int(os.environ.get("DFLASH_TEST_THREADS", "1")))

from sglang_helpers import TinyPair, build_sglang_drafter, make_tiny_pair  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyPair:
    """A small random Llama target config and a random DFlash drafter checkpoint for it."""
    return make_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def plugins_loaded():
    """SGLang's own plugin loading (entry points + hooks), as every SGLang process does it."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="session")
def sglang_drafter(tiny, plugins_loaded):
    """The tiny drafter as SGLang builds it (sglang_helpers.build_sglang_drafter)."""
    return build_sglang_drafter(tiny.drafter_dir)
