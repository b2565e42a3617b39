"""The World English Bible (Debian sword-text-web, public domain): narrative and poetic
passages, read from the SWORD zText module (zlib blocks of OSIS XML) without libsword."""

from __future__ import annotations

import random
import re
import struct
import zlib
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.text import chunk_paragraphs

INFO = SourceInfo("webbible", "sword-text-web", "public domain (World English Bible)")
MODULE = "usr/share/sword/modules/texts/ztext/engWEB2015eb"


def books(root: Path) -> dict[str, list[str]]:
    """Book name -> paragraphs of plain text."""
    out = {}
    for testament in ("ot", "nt"):
        index = (root / MODULE / f"{testament}.bzs").read_bytes()
        blocks = (root / MODULE / f"{testament}.bzz").read_bytes()
        for i in range(0, len(index) - 11, 12):
            offset, size, _ = struct.unpack("<III", index[i:i + 12])
            xml = zlib.decompress(blocks[offset:offset + size]).decode("utf-8", "replace")
            name = re.search(r'<milestone n="([^"]+)" type="x-usfm-h"', xml)
            if not name:
                continue
            xml = re.sub(r"<note\b.*?</note>|<title\b.*?</title>", " ", xml, flags=re.S)
            paras = []
            for piece in re.split(r'<div sID="[^"]*" type="x-p"/>|<lg\b[^>]*>', xml):
                text = " ".join(re.sub(r"<[^>]+>", " ", piece).split())
                text = re.sub(r" ([,.;:!?’”])", r"\1", text)
                text = re.sub(r"([“‘]) ", r"\1", text)
                if len(text.split()) >= 8:
                    paras.append(text)
            out[name.group(1)] = paras
    return out


def materials(root: Path, rng: random.Random) -> list[Material]:
    out = []
    for book, paras in books(root).items():
        for i, passage in enumerate(chunk_paragraphs(paras, 90, 260)):
            fields = {"passage": passage, "work": f"the book of {book} (World English Bible)",
                      "title": book}
            out.append(Material("old_text_passage", fields, f"web:{book}:{i}"))
    return out
