"""Whether a hook on vLLM internals (the patches P1 and P2, the draft-ids executor) may go in:
this vLLM is a tested release series, and the methods the hook overrides or calls still take
the parameters it was written against. Each hook lists those methods; a non-empty answer keeps
the hook out (with a warning naming the problems) and leaves vLLM's own behaviour in place.
`patch_method` applies a patch under those guards, once per process."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

# Set on each replacement this plugin installs: the vLLM function it replaced.
PATCH_MARKER = "__dflash_plugin_original__"


def unpatched(method: Callable) -> Callable:
    """The vLLM function under one of this plugin's patches (`method` itself if unpatched)."""
    return getattr(method, PATCH_MARKER, method)


def version_problems() -> list[str]:
    """[] for a tested release series or with the skip-version-check override."""
    from dflash_plugin.switches import read
    from vllm_ext.plugin import version_is_tested, vllm_version

    version = vllm_version()
    if version_is_tested(version) or read("DFLASH_VLLM_SKIP_VERSION_CHECK"):
        return []
    return [f"vLLM {version} is not a tested release series"]


def signature_problems(owner: type, expected: Mapping[str, tuple[str, ...]],
                       unwrap: Callable = lambda method: method) -> list[str]:
    """Methods of `owner` that are missing or whose parameters differ from `expected`;
    `unwrap` maps a method to the function to inspect (e.g. the original under a patch)."""
    problems = []
    for name, params in expected.items():
        method = getattr(owner, name, None)
        if method is None:
            problems.append(f"{owner.__name__}.{name} is missing")
            continue
        found = tuple(inspect.signature(unwrap(method)).parameters)
        if found != params:
            problems.append(f"{owner.__name__}.{name} has parameters {found}, "
                            f"expected {params}")
    return problems


def hook_problems(owner: type, expected: Mapping[str, tuple[str, ...]]) -> list[str]:
    """version_problems + signature_problems of `owner`, looking under this plugin's patches."""
    return version_problems() + signature_problems(owner, expected, unwrap=unpatched)


def patch_method(owner: type, name: str, make_replacement: Callable[[Callable], Callable],
                 expected: Mapping[str, tuple[str, ...]], refused: str, applied: str) -> bool:
    """Replace `owner.name` by make_replacement(original) once per process, unless the guards
    find problems with `expected` (then `refused` is logged with them, and nothing changes).
    True if the patch is (now or already) in place."""
    if hasattr(getattr(owner, name), PATCH_MARKER):
        return True
    problems = hook_problems(owner, expected)
    if problems:
        logger.warning("dflash plugin: %s (%s)", refused, "; ".join(problems))
        return False
    original = getattr(owner, name)
    replacement = functools.wraps(original)(make_replacement(original))
    setattr(replacement, PATCH_MARKER, original)
    setattr(owner, name, replacement)
    logger.info("dflash plugin: patched %s.%s (%s)", owner.__name__, name, applied)
    return True
