"""Jane Austen's six novels (Debian r-cran-janeaustenr; the novels are public domain), read
straight from the R package's lazy-load database without R."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.text import chunk_paragraphs

INFO = SourceInfo("austen", "r-cran-janeaustenr",
                  "MIT (package); the novels are public domain")


def _r_strings(blob: bytes) -> list[str]:
    """The character vector in one R serialisation (XDR, format 2 or 3) of a STRSXP."""
    if blob[:2] != b"X\n":
        raise ValueError("not an XDR R serialisation")
    pos = 2
    version = struct.unpack(">i", blob[pos:pos + 4])[0]
    pos += 12
    if version == 3:
        n = struct.unpack(">i", blob[pos:pos + 4])[0]
        pos += 4 + n
    flags, length = struct.unpack(">ii", blob[pos:pos + 8])
    if flags & 0xFF != 16:
        raise ValueError("not a character vector")
    pos += 8
    out = []
    for _ in range(length):
        _flags, n = struct.unpack(">ii", blob[pos:pos + 8])
        pos += 8
        if n < 0:
            out.append("")
            continue
        out.append(blob[pos:pos + n].decode("utf-8", "replace"))
        pos += n
    return out


def novels(root: Path) -> dict[str, list[str]]:
    data = (root / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb").read_bytes()
    books, pos = {}, 0
    while pos < len(data):
        d = zlib.decompressobj()
        blob = d.decompress(data[pos + 4:])
        pos = len(data) - len(d.unused_data)
        lines = _r_strings(blob)
        title = next(x for x in lines if x.strip()).strip().title()
        books[title] = lines
    return books


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for title, lines in novels(root).items():
        paras, cur = [], []
        for line in lines:
            if line.strip():
                cur.append(line.strip())
            elif cur:
                paras.append(" ".join(cur))
                cur = []
        paras = [p for p in paras if not p.isupper() and not p.startswith("CHAPTER")]
        for i, passage in enumerate(chunk_paragraphs(paras, 90, 300)):
            fields = {"passage": passage, "work": f"Jane Austen's {title}", "author": "Jane Austen",
                      "title": title}
            out.append(Material("story_passage", fields, f"austen:{title}:{i}"))
    return out
