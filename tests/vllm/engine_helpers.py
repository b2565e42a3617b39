"""Helpers for the tests that start real vLLM engines (in this process): the shipped drafter,
environment variables set for one engine's lifetime, and an engine that is always shut down.

Engines run one at a time: each is shut down, and its memory collected, before the next starts;
only the session's plain engine (conftest.py's `plain_llm`) stays up beside them, idle.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path


def shipped_drafter() -> Path | None:
    """The drafter shipped with the package, or None where the checkout has none."""
    from dflash_plugin.defaults import DEFAULT_DRAFTER_NAME, DRAFTERS_DIR

    path = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
    return path if (path / "config.json").is_file() else None


@contextmanager
def environment(**values: str):
    """os.environ with `values` set inside the block, as it was after it (the engine's worker
    processes read the variables at start-up, so they must stay set while it runs)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def engine(target, drafter=None, *, num_speculative_tokens: int, speculative: dict | None = None,
           **llm_args):
    """vLLM's LLM on `target`, with DFlash speculation from `drafter` when one is given
    (`speculative`: more speculative_config fields); shut down when the block ends."""
    import torch
    from vllm import LLM

    if drafter is not None:
        llm_args["speculative_config"] = {"method": "dflash", "model": str(drafter),
                                          "num_speculative_tokens": num_speculative_tokens,
                                          **(speculative or {})}
    llm = LLM(model=str(target), **llm_args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
