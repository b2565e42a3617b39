"""The Jargon File 4.4.7 (Debian jargon-text, public domain): hacker slang with its stories."""

from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.text import paragraphs

INFO = SourceInfo("jargon", "jargon-text", "public domain")


def materials(root: Path, rng: random.Random) -> list[Material]:
    text = gzip.open(root / "usr/share/doc/jargon-text/jargon.txt.gz", "rt",
                     encoding="utf-8").read()
    out = []
    for block in re.split(r"\n   :(?=[^\n:]+:)", text)[1:]:
        head, _, body = block.partition(":")
        term = head.strip()
        body = re.sub(r"\{([^}]*)\}", r"\1", body)
        paras = paragraphs(body)
        if not paras:
            continue
        paras[0] = re.sub(r"^/[^/]*/,?\s*", "", paras[0])  # pronunciation
        entry = "\n\n".join(p for p in paras if p)
        n = len(entry.split())
        if 25 <= n <= 300 and term.isascii():
            out.append(Material("term", {"term": term, "definition": entry,
                                         "domain": "hacker slang"}, f"jargon:{term}"))
    return out
