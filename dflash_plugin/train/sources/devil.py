"""Ambrose Bierce's The Devil's Dictionary (Debian dict-devil, public domain): satirical
definitions to explain, answer seriously or imitate."""

from __future__ import annotations

import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.dictd import entries

INFO = SourceInfo("devil", "dict-devil", "public domain")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for head, body in entries(root / "usr/share/dictd", "devil"):
        text = " ".join(body.split())
        m = re.match(r"([A-Z][A-Z' -]+),\s*(?:[a-z]+\.\s*)+(.*)", text)
        if not m or len(m.group(2).split()) < 4 or len(text.split()) > 220:
            continue
        word = m.group(1).strip().lower()
        out.append(Material("satire", {"term": word, "definition": text}, f"devil:{word}"))
    return out
