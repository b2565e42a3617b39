"""Man pages (roff) as materials: the NAME line as a topic, prose sections as passages,
EXAMPLES blocks as code. Read directly, so no man or groff is needed."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material
from dflash_plugin.train.sources.text import chunk_paragraphs, is_english, paragraphs, roff_sections

SKIP_SECTIONS = {"SEE ALSO", "COLOPHON", "AUTHOR", "AUTHORS", "COPYRIGHT", "REPORTING BUGS",
                 "VERSIONS", "STANDARDS", "CONFORMING TO", "HISTORY", "ATTRIBUTES", "LIBRARY",
                 "SYNOPSIS", "GIT"}


def man_pages(root: Path, sections: tuple[str, ...]):
    """(page name, section number, parsed blocks) for every real page (no links, no .so)."""
    for sec in sections:
        for path in sorted((root / f"usr/share/man/man{sec}").glob("*.gz")):
            if path.is_symlink():
                continue
            text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
            if text.lstrip().startswith(".so "):
                continue
            yield path.name.split(".")[0], sec, roff_sections(text)


def page_materials(name: str, sec: str, blocks, *, key: str, domain: str, lang: str | None,
                   topic_kind: str) -> list[Material]:
    out = []
    name_text = " ".join(t for h, t, code in blocks if h == "NAME" and not code)
    summary = re.split(r"\s+-+\s+", name_text, maxsplit=1)
    if len(summary) == 2 and summary[1]:
        out.append(Material(topic_kind, {"name": name, "section": sec,
                                         "summary": " ".join(summary[1].split()).rstrip("."),
                                         "domain": domain}, f"{key}:{name}.{sec}:name"))
    prose = []
    for i, (heading, text, code) in enumerate(blocks):
        if heading in SKIP_SECTIONS or heading == "NAME":
            continue
        if code:
            n_lines = text.count("\n") + 1
            looks_right = lang != "c" or ("{" in text and ";" in text)
            if lang and heading in ("EXAMPLES", "EXAMPLE") and 8 <= n_lines <= 70 \
                    and len(text) < 2600 and looks_right:
                out.append(Material("code", {"code": text, "lang": lang, "domain": domain,
                                             "topic": f"{name}({sec})"},
                                    f"{key}:{name}.{sec}:code:{i}"))
            continue
        prose += [p for p in paragraphs(text) if len(p.split()) >= 6 and is_english(p)]
    for i, passage in enumerate(chunk_paragraphs(prose, 80, 300)):
        out.append(Material("tech_passage", {"passage": passage, "domain": domain,
                                             "work": f"the {name}({sec}) man page",
                                             "topic": name}, f"{key}:{name}.{sec}:p:{i}"))
    return out


def materials_for(root: Path, sections: tuple[str, ...], *, key: str, domain: str,
                  lang: str | None, topic_kind: str) -> list[Material]:
    out = []
    for name, sec, blocks in man_pages(root, sections):
        out += page_materials(name, sec, blocks, key=key, domain=domain, lang=lang,
                              topic_kind=topic_kind)
    return out
