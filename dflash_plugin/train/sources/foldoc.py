"""FOLDOC, the Free On-line Dictionary of Computing (Debian dict-foldoc, GFDL 1.1+):
computing terms to explain."""

from __future__ import annotations

import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.dictd import entries

INFO = SourceInfo("foldoc", "dict-foldoc", "GFDL 1.1 or later, no invariant sections")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for head, body in entries(root / "usr/share/dictd", "foldoc"):
        lines = body.split("\n", 1)
        if len(lines) < 2:
            continue
        text = re.sub(r"\{([^}]*)\}", r"\1", lines[1])
        text = re.sub(r"\(\d{4}-\d\d-\d\d\)\s*$", "", text.strip())
        domain = re.match(r"\s*<([^>]+)>", text)
        text = " ".join(re.sub(r"^\s*<[^>]+>\s*", "", text).split())
        if not domain or not 20 <= len(text.split()) <= 250 or not head.isascii():
            continue
        out.append(Material("term", {"term": head, "definition": text,
                                     "domain": domain.group(1)}, f"foldoc:{head.lower()}"))
    return out
