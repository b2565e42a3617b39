"""Fixtures for tests against real `dflash serve` servers (helpers: server_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_helpers import HAVE_SERVER_DEPS, make_random_drafter


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs vLLM (CPU build) and the openai client")
    for item in items:
        if "vllm" in item.keywords and not HAVE_SERVER_DEPS:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def target_path() -> Path:
    from dflash_plugin.target import ensure_default_target
    return ensure_default_target()


@pytest.fixture(scope="session")
def random_drafter(tmp_path_factory, target_path) -> Path:
    return make_random_drafter(tmp_path_factory.mktemp("drafters") / "random-dflash", target_path)


@pytest.fixture(scope="session")
def shipped_drafter() -> Path | None:
    from dflash_plugin.defaults import DEFAULT_DRAFTER_NAME, DRAFTERS_DIR
    path = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
    return path if (path / "config.json").is_file() else None


@pytest.fixture(scope="session")
def drafter(shipped_drafter, random_drafter) -> Path:
    """The shipped (trained) drafter when it exists, else the random one."""
    return shipped_drafter or random_drafter


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")
