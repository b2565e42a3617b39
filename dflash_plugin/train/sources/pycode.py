"""Python functions as code material (docstrings removed where the task would give the answer
away, a one-token bug planted for fix-it tasks, the docstring's summary as a specification)."""

from __future__ import annotations

import ast
import random
import re
import textwrap
from pathlib import Path

from dflash_plugin.train.sources.base import Material

# (pattern, replacement) pairs that change behaviour without breaking syntax.
MUTATIONS = ((" <= ", " < "), (" < ", " <= "), (" >= ", " > "), (" > ", " >= "),
             (" == ", " != "), (" != ", " == "), (" + 1", " - 1"), (" - 1", " + 1"),
             (" and ", " or "), (" or ", " and "), ("return True", "return False"),
             ("return False", "return True"), ("[1:]", "[:1]"), ("[-1]", "[0]"))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _without_docstring(source_lines: list[str], node) -> str:
    lines = source_lines[node.lineno - 1: node.end_lineno]
    if node.decorator_list:
        lines = source_lines[node.decorator_list[0].lineno - 1: node.end_lineno]
    doc = node.body[0] if node.body and isinstance(node.body[0], ast.Expr) and \
        isinstance(getattr(node.body[0], "value", None), ast.Constant) and \
        isinstance(node.body[0].value.value, str) else None
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    if doc is not None and len(node.body) > 1:
        cut = set(range(doc.lineno - start, doc.end_lineno - start + 1))
        lines = [l for i, l in enumerate(lines) if i not in cut]
    return textwrap.dedent("\n".join(lines)).strip("\n")


def function_materials(path: Path, *, key: str, domain: str, rng: random.Random,
                       lines: tuple[int, int] = (5, 35)) -> list[Material]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):  # dangling links, py2 files
        return []
    source_lines = source.splitlines()
    out = []
    for node in _functions(tree):
        if node.name.startswith("__") or node.name.startswith("test"):
            continue
        code = _without_docstring(source_lines, node)
        n = code.count("\n") + 1
        if not lines[0] <= n <= lines[1] or len(code) > 1600 or "\t" in code:
            continue
        doc = ast.get_docstring(node) or ""
        summary = " ".join(doc.split("\n\n")[0].split())
        fields = {"code": code, "lang": "python", "name": node.name, "domain": domain,
                  "topic": f"{node.name} in {path.stem}"}
        base = f"{key}:{path.stem}:{node.name}:{node.lineno}"
        out.append(Material("function", fields, base))
        muts = [(a, b) for a, b in MUTATIONS if a in code.split("\n", 1)[-1]]
        if muts:
            a, b = rng.choice(muts)
            head, _, body = code.partition("\n")
            spots = [m.start() for m in re.finditer(re.escape(a), body)]
            at = rng.choice(spots)
            buggy = head + "\n" + body[:at] + b + body[at + len(a):]
            out.append(Material("buggy_code", {**fields, "code": buggy}, base + ":bug"))
        if 6 <= len(summary.split()) <= 60:
            args = ", ".join(a.arg for a in node.args.args if a.arg not in ("self", "cls"))
            out.append(Material("spec", {"name": node.name, "args": args, "doc": summary,
                                         "lang": "python", "domain": domain},
                                base + ":spec"))
    return out
