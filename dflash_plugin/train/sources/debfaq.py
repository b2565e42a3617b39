"""The Debian GNU/Linux FAQ (Debian debian-faq)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import numbered_text_sections, section_materials

INFO = SourceInfo("debfaq", "debian-faq", "permission to copy verbatim and modified (SPI)")


def materials(root: Path, rng: random.Random) -> list[Material]:
    text = gzip.open(root / "usr/share/doc/debian/FAQ/debian-faq.en.txt.gz", "rt",
                     encoding="utf-8", errors="replace").read()
    return section_materials(numbered_text_sections(text), key="debfaq", domain="Debian Linux",
                             work="the Debian FAQ", lang="shell", code_lines=(2, 30),
                             min_words=50)
