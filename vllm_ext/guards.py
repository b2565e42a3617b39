"""Whether a hook on vLLM internals (the propose patch, the draft-ids executor) may go in: this
vLLM is a tested release series, and the methods the hook overrides or calls still take the
parameters it was written against. Each hook lists those methods; a non-empty answer keeps the
hook out (with a warning naming the problems) and leaves vLLM's own behaviour in place."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping


def version_problems() -> list[str]:
    """[] for a tested release series or with the skip-version-check override."""
    from vllm_ext.plugin import SKIP_VERSION_CHECK_ENV, version_is_tested, vllm_version

    version = vllm_version()
    if version_is_tested(version) or os.environ.get(SKIP_VERSION_CHECK_ENV) == "1":
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
