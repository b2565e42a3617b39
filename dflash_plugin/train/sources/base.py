"""What a source reader hands to the task templates."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Material:
    """One piece of source content: `kind` says which task families can use it (see tasks.py),
    `fields` fill their phrasings, `key` identifies it so it is used at most once per family."""

    kind: str
    fields: dict[str, str] = field(hash=False, compare=False)
    key: str


@dataclass(frozen=True)
class SourceInfo:
    name: str        # what the builder and CLI call it (--prompt-sources)
    package: str     # Debian package it reads, or "generated" (made here from seeded numbers)
    licence: str
