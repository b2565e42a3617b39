"""NetworkX 2.8 graph algorithms (Debian python3-networkx): algorithm code to explain, test,
fix or implement from its description."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.pycode import function_materials

INFO = SourceInfo("networkx", "python3-networkx", "BSD-3-Clause")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for path in sorted(root.glob("usr/lib/python3/dist-packages/networkx/**/*.py")):
        if "/tests/" in path.as_posix():
            continue
        out += function_materials(path, key="networkx", domain="Python graph algorithms",
                                  rng=rng, lines=(5, 40))
    return out
