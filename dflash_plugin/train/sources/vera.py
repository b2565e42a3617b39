"""V.E.R.A., a list of computing acronyms (Debian dict-vera, GFDL)."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.dictd import entries

INFO = SourceInfo("vera", "dict-vera", "GFDL 1.1 or later, no invariant sections")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for head, body in entries(root / "usr/share/dictd", "vera"):
        acronym, _, rest = body.partition("\n")
        expansion = " ".join(rest.split())
        if (acronym.isascii() and acronym.isupper() and 2 <= len(acronym) <= 6
                and 2 <= len(expansion.split()) <= 12):
            out.append(Material("acronym", {"acronym": acronym, "expansion": expansion},
                                f"vera:{acronym}"))
    return out
