"""Go: the language specification (Debian golang-1.19-doc) and the standard library's source
(golang-1.19-src): Example functions with their printed output, and documented functions."""

from __future__ import annotations

import random
import re
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.docs import section_materials
from dflash_plugin.train.sources.htmldocs import html_sections

SPEC = SourceInfo("gospec", "golang-1.19-doc", "BSD-3-Clause (Go licence)")
SRC = SourceInfo("gosrc", "golang-1.19-src", "BSD-3-Clause (Go licence)")
_FUNC = re.compile(r"^((?://[^\n]*\n)*)func (\(\w+ \*?\w+\) )?(\w+)\(.*?^}\n", re.S | re.M)


def spec_materials(root: Path, rng: random.Random) -> list[Material]:
    html_dir = next(root.glob("usr/share/doc/golang-1.19-doc/html"))
    out = []
    for name in ("go_spec", "go_mem"):
        sections = html_sections((html_dir / f"{name}.html").read_text(encoding="utf-8"))
        out += section_materials(sections, key=f"gospec:{name}", domain="Go",
                                 work="the Go language specification" if name == "go_spec"
                                 else "the Go memory model", lang="go", code_lines=(3, 30),
                                 min_words=60)
    # The spec's grammar productions (Name = ... .) are EBNF, not Go code.
    ebnf = re.compile(r"^\w+\s+=\s.*\.\s*$", re.M)
    return [m for m in out if m.kind != "code" or not ebnf.search(m.fields["code"])]


def src_materials(root: Path, rng: random.Random) -> list[Material]:
    src = root / "usr/share/go-1.19/src"
    out = []
    for path in sorted(src.rglob("*.go")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(("cmd/", "vendor/", "internal/", "runtime/")) or "/testdata/" in rel:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in _FUNC.finditer(text):
            doc, name, code = m.group(1), m.group(3), m.group(0)
            n = code.count("\n")
            if not 4 <= n <= 45 or len(code) > 1800:
                continue
            key = f"go:{rel}:{name}"
            if path.name.endswith("_test.go"):
                if name.startswith("Example") and "// Output:" in code:
                    body = code.split("// Output:")[0].rstrip() + "\n}"
                    body = re.sub(r"^(?://[^\n]*\n)+", "", body)
                    out.append(Material("output_code", {"code": body, "lang": "go",
                                                        "topic": rel.rsplit("/", 1)[0]}, key))
            elif doc and name[0].isupper():
                code = code[len(doc):]
                summary = " ".join(l.lstrip("/ ") for l in doc.splitlines())
                out.append(Material("function", {"code": code.strip(), "lang": "go", "name": name,
                                             "domain": "Go", "topic": rel.rsplit("/", 1)[0]},
                                    key))
                if 6 <= len(summary.split()) <= 60:
                    out.append(Material("spec", {"name": name, "doc": summary, "lang": "go",
                                                 "args": "", "domain": "Go"}, key + ":spec"))
    return out
