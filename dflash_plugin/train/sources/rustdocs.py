"""Rust 1.63 documentation sources (Debian rust-src): the compiler's error-code explanations
(a failing example each) and The Rust Programming Language / Rust by Example in markdown."""

from __future__ import annotations

import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import markdown_sections, section_materials

INFO = SourceInfo("rustdocs", "rust-src", "MIT or Apache-2.0")


def materials(root: Path, rng: random.Random) -> list[Material]:
    base = root / "usr/src/rustc-1.63.0"
    out = []
    for path in sorted((base / "compiler/rustc_error_codes/src/error_codes").glob("E*.md")):
        text = path.read_text(encoding="utf-8")
        failing = re.search(r"```compile_fail[^\n]*\n(.*?)```", text, re.S)
        if failing and "#![feature" not in failing.group(1):
            code = "\n".join(l for l in failing.group(1).splitlines() if not l.startswith("# "))
            if 3 <= code.count("\n") + 1 <= 40:
                out.append(Material("rust_error", {"code": code.strip(), "lang": "rust",
                                                   "error": path.stem}, f"rust:{path.stem}"))
    for book, work in (("book/src", "The Rust Programming Language"),
                       ("rust-by-example/src", "Rust by Example")):
        for path in sorted((base / "src/doc" / book).rglob("*.md")):
            sections = markdown_sections(path.read_text(encoding="utf-8", errors="replace"))
            for s in sections:
                s.code = [c for c in s.code if "{{#" not in c]
            out += section_materials(sections, key=f"rust:{book}:{path.stem}", domain="Rust",
                                     work=work, lang="rust", min_words=60)
    return out
