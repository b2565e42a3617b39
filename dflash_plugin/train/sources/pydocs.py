"""The Python 3.11 documentation's reST sources (Debian python3.11-doc): library reference,
tutorial, how-tos, FAQ and language reference. What's New and index pages are skipped."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import rst_sections, section_materials

INFO = SourceInfo("pydocs", "python3.11-doc", "PSF-2.0 (examples also 0BSD)")
PARTS = ("library", "tutorial", "howto", "faq", "reference", "using", "extending")


def materials(root: Path, rng: random.Random) -> list[Material]:
    base = root / "usr/share/doc/python3.11/html/_sources"
    out = []
    for part in PARTS:
        for path in sorted((base / part).glob("*.rst.txt")):
            if path.name in ("index.rst.txt",):
                continue
            sections = rst_sections(path.read_text(encoding="utf-8", errors="replace"))
            page = path.name.removesuffix(".rst.txt")
            work = f"the Python 3.11 docs ({part}/{page})"
            out += section_materials(sections, key=f"pydocs:{part}/{page}", domain="Python",
                                     work=work, lang="python")
    return out
