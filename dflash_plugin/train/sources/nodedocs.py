"""The Node.js 18 API documentation in markdown (Debian nodejs-doc)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import markdown_sections, section_materials

INFO = SourceInfo("nodedocs", "nodejs-doc", "MIT (Expat)")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for path in sorted((root / "usr/share/doc/nodejs/api").glob("*.md.gz")):
        module = path.name.removesuffix(".md.gz")
        text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
        out += section_materials(markdown_sections(text), key=f"node:{module}",
                                 domain="Node.js", work=f"the Node.js 18 docs on {module}",
                                 lang="javascript", min_words=60)
    return out
