"""The Debian Reference (Debian debian-reference-en): system administration how-tos with
shell commands."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import numbered_text_sections, section_materials

INFO = SourceInfo("debref", "debian-reference-en", "GPL-2+")


def materials(root: Path, rng: random.Random) -> list[Material]:
    text = gzip.open(root / "usr/share/debian-reference/debian-reference.en.txt.gz", "rt",
                     encoding="utf-8", errors="replace").read()
    return section_materials(numbered_text_sections(text), key="debref", domain="Debian Linux",
                             work="the Debian Reference", lang="shell", code_lines=(2, 30),
                             min_words=60)
