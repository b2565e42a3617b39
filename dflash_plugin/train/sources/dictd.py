"""Reading dictd dictionaries (.index + gzip'd .dict.dz) as (headword, entry text) pairs."""

from __future__ import annotations

import gzip
from pathlib import Path

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _number(b64: str) -> int:
    n = 0
    for c in b64:
        n = n * 64 + _B64.index(c)
    return n


def entries(dict_dir: Path, name: str) -> list[tuple[str, str]]:
    body = gzip.open(dict_dir / f"{name}.dict.dz").read()
    out = []
    for line in (dict_dir / f"{name}.index").read_text(encoding="utf-8",
                                                        errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        start, size = _number(parts[1]), _number(parts[2])
        out.append((parts[0], body[start:start + size].decode("utf-8", "replace")))
    return out
