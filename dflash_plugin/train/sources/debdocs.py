"""Debian's own guides as numbered plain text: the Debian Reference (debian-reference-en,
system administration how-tos with shell commands) and the Debian GNU/Linux FAQ (debian-faq).
The two read alike; what differs (file, key, title, shortest section) is data."""

from __future__ import annotations

import gzip
import random
from functools import partial
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import numbered_text_sections, section_materials

REFERENCE = SourceInfo("debref", "debian-reference-en", "GPL-2+")
FAQ = SourceInfo("debfaq", "debian-faq", "permission to copy verbatim and modified (SPI)")


def guide_materials(root: Path, rng: random.Random, *, path: str, key: str, work: str,
                    min_words: int) -> list[Material]:
    with gzip.open(root / path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return section_materials(numbered_text_sections(text), key=key, domain="Debian Linux",
                             work=work, lang="shell", code_lines=(2, 30), min_words=min_words)


reference_materials = partial(
    guide_materials, path="usr/share/debian-reference/debian-reference.en.txt.gz", key="debref",
    work="the Debian Reference", min_words=60)
faq_materials = partial(
    guide_materials, path="usr/share/doc/debian/FAQ/debian-faq.en.txt.gz", key="debfaq",
    work="the Debian FAQ", min_words=50)
