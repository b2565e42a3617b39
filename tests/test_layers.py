"""The project's layers: the core (dflash_plugin) imports no engine, adapter or CLI, and no two
of the project's modules import each other, directly or around a loop."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dflash_plugin", "vllm_ext", "sglang_ext", "dflash_cli")
ABOVE_THE_CORE = ("vllm", "sglang", "vllm_ext", "sglang_ext", "dflash_cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES
            for path in sorted((ROOT / package).rglob("*.py"))}


def test_the_core_imports_no_engine_adapter_or_cli():
    """Every module under dflash_plugin, imported in one fresh interpreter."""
    core = sorted(name for name in project_modules() if name.split(".")[0] == "dflash_plugin")
    script = (f"import importlib, json, sys\n"
              f"for name in {core!r}:\n"
              f"    importlib.import_module(name)\n"
              f"print(json.dumps(sorted(m for m in sys.modules\n"
              f"                        if m.split('.')[0] in {ABOVE_THE_CORE!r})))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _top_level_imports(tree: ast.Module):
    """Import statements at module level: its body and the bodies of top-level if / try
    blocks, `if TYPE_CHECKING:` included (a cycle there is still two modules that each need
    the other); imports inside functions are left out."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    assert graph["vllm_ext.model"] >= {"vllm_ext.drafting", "dflash_plugin.draft_policy"}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
