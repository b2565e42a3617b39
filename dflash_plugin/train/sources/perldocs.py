"""Perl 5.36 documentation in POD (Debian perl-doc): the perlfaq questions and the tutorials."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import pod_sections, section_materials

INFO = SourceInfo("perldocs", "perl-doc", "GPL-1+ or Artistic")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    pods = sorted((root / "usr/share/perl").glob("5.*/pod/*.pod"))
    for path in pods:
        name = path.stem
        if "delta" in name or name.startswith(("perlhist", "perlport", "perlapi", "perlintern")):
            continue
        sections = pod_sections(path.read_text(encoding="utf-8", errors="replace"))
        out += section_materials(sections, key=f"perl:{name}", domain="Perl",
                                 work=f"the Perl documentation ({name})", lang="perl")
    return out
