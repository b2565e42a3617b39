"""The Python 3.11 standard library (Debian libpython3.11-stdlib): functions to explain, test,
fix, translate or rewrite, and the language reference topics of pydoc_data."""

from __future__ import annotations

import random
import runpy
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.pycode import function_materials
from dflash_plugin.train.sources.text import chunk_paragraphs, paragraphs

INFO = SourceInfo("stdlib", "libpython3.11-stdlib", "PSF-2.0")
SKIP = ("test", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "distutils",
        "pydoc_data", "encodings", "config-", "site-packages", "dist-packages", "venv")


def materials(root: Path, rng: random.Random) -> list[Material]:
    lib = root / "usr/lib/python3.11"
    out = []
    for path in sorted(lib.rglob("*.py")):
        rel = path.relative_to(lib).as_posix()
        if any(rel.startswith(s) or f"/{s}" in rel for s in SKIP):
            continue
        out += function_materials(path, key="stdlib", domain="Python", rng=rng)
    topics = runpy.run_path(str(lib / "pydoc_data/topics.py"))["topics"]
    for name in sorted(topics):
        for i, passage in enumerate(chunk_paragraphs(paragraphs(topics[name]), 80, 300)):
            out.append(Material("tech_passage", {"passage": passage, "domain": "Python",
                                                 "work": "the Python language reference",
                                                 "topic": name}, f"pydoc:{name}:{i}"))
    return out
