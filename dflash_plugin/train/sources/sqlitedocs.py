"""The SQLite documentation (Debian sqlite3-doc, public domain): SQL language pages and how
SQLite works."""

from __future__ import annotations

import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import section_materials
from dflash_plugin.train.sources.htmldocs import html_sections

INFO = SourceInfo("sqlitedocs", "sqlite3-doc", "public domain")


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for path in sorted((root / "usr/share/doc/sqlite3").glob("*.html")):
        if path.stem.startswith(("c3ref", "releaselog", "doclist", "sitemap", "index", "news",
                                 "chronology", "changes", "keyword_index", "capi3ref",
                                 "fileio", "copyright")):
            continue
        sections = html_sections(path.read_text(encoding="utf-8", errors="replace"))
        out += section_materials(sections, key=f"sqlite:{path.stem}", domain="SQL (SQLite)",
                                 work=f"the SQLite docs ({path.stem})", lang="sql",
                                 code_lines=(2, 30), min_words=60)
    sql = re.compile(r"\b(SELECT|CREATE|INSERT|UPDATE|DELETE|PRAGMA|WITH)\b", re.I)
    for m in out:
        if m.kind == "code" and not sql.search(m.fields["code"]):
            m.fields["lang"] = "c"  # the docs also show C API code
    return out
