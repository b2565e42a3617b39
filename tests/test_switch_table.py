"""The DFLASH_* switch table (dflash_plugin.switches): one declaration per variable, every read
through it, the README's table in step with it, and bad values refused by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dflash_plugin import switches
from dflash_plugin.switches import SWITCHES, SwitchError, read

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dflash_plugin", "vllm_ext", "sglang_ext", "dflash_cli")
SWITCH_MODULE = ROOT / "dflash_plugin" / "switches.py"
NAME = re.compile(r"DFLASH_[A-Z0-9_]+")
# Methods and functions that read a mapping (or the process environment) by key.
READERS = {"get", "pop", "setdefault", "getenv"}


def readme_table() -> dict[str, tuple[str, str, str]]:
    """README "## Environment switches": variable -> (values, default, meaning)."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Environment switches\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, "README.md has no '## Environment switches' section"
    rows = {}
    for line in match[1].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("variable", "") or set(cells[0]) <= {"-"}:
            continue
        assert len(cells) == 4, f"README switch row is not | variable | values | default | " \
                                f"meaning |: {line}"
        rows[cells[0].strip("`")] = tuple(cells[1:])
    return rows


def test_the_readme_table_and_the_module_list_the_same_switches():
    readme = readme_table()
    declared = {s.name: (s.values, s.shown_default, s.meaning) for s in SWITCHES}
    assert sorted(readme) == sorted(declared), "names differ between README.md and switches.py"
    for name, row in declared.items():
        assert readme[name] == row, f"{name}: README {readme[name]} != switches.py {row}"


def test_every_switch_is_declared_once_with_a_meaning():
    names = [s.name for s in SWITCHES]
    assert len(names) == len(set(names))
    for s in SWITCHES:
        assert NAME.fullmatch(s.name) and s.meaning and "|" not in s.meaning
        assert bool(s.choices) == (s.kind == "choice")
        if s.default is not None and s.kind in ("on/off", "choice", "count"):
            read(s.name, {})  # the default itself is a valid value


def _python_files():
    for package in PACKAGES:
        yield from (p for p in sorted((ROOT / package).rglob("*.py")) if p != SWITCH_MODULE)


def _names_bound_to_switches(trees) -> set[str]:
    """Module constants holding a DFLASH_ name (NAME = "DFLASH_..."), in any module."""
    bound = set()
    for tree in trees:
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and NAME.fullmatch(node.value.value)):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return bound


def _environment_reads(tree, constants: set[str]) -> list[tuple[int, str]]:
    """Reads of a DFLASH_ key from a mapping: m.get(K), m[K], K in m, os.getenv(K), ..."""

    def switch_key(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and NAME.fullmatch(node.value):
            return node.value
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        # a constant bound in the scanned code, or named like one (X_ENV) imported from elsewhere
        return name if name in constants or (name or "").endswith("_ENV") else None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in READERS:
                key = switch_key(node.args[0])
        elif isinstance(node, ast.Subscript):
            key = switch_key(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                   for op in node.ops):
            key = switch_key(node.left)
        if key is not None:
            found.append((node.lineno, key))
    return found


def test_no_environment_read_of_a_switch_outside_the_switch_module():
    trees = {path: ast.parse(path.read_text(), str(path)) for path in _python_files()}
    constants = _names_bound_to_switches(trees.values())
    reads = [f"{path.relative_to(ROOT)}:{line}: {key}" for path, tree in trees.items()
             for line, key in _environment_reads(tree, constants)]
    assert not reads, "read these through dflash_plugin.switches.read:\n" + "\n".join(reads)
    # Nor a second declaration of a name: constants that hold one invite such reads.
    assert not constants, f"module constants holding DFLASH_ names: {sorted(constants)}"


def test_the_read_check_sees_reads_in_every_spelling():
    source = ('import os\nK = "DFLASH_X"\nos.environ.get("DFLASH_A")\nos.environ["DFLASH_B"]\n'
              'os.getenv(K)\nif "DFLASH_C" in env: pass\nenv.get("OTHER")\nos.environ.get(m.X_ENV)\n')
    tree = ast.parse(source)
    keys = [key for _, key in _environment_reads(tree, _names_bound_to_switches([tree]))]
    assert keys == ["DFLASH_A", "DFLASH_B", "K", "DFLASH_C", "X_ENV"]


def test_every_name_the_code_and_scripts_use_is_declared():
    used = set()
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                used |= set(NAME.findall(node.value))
    for script in [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / "Makefile"]:
        used |= set(re.findall(r"\$\{?(DFLASH_[A-Z0-9_]+)", script.read_text()))
    # Names the bench's own messages spell out as placeholders, not variables.
    used -= {"DFLASH_NAME"}
    undeclared = used - set(switches.BY_NAME)
    assert not undeclared, f"not declared in dflash_plugin/switches.py: {sorted(undeclared)}"


def test_on_off_switches_take_every_spelling_and_refuse_the_rest():
    for value, expected in (("on", True), ("1", True), ("TRUE", True), (" off ", False),
                            ("0", False), ("false", False)):
        assert read("DFLASH_DEFER_CONTEXT", {"DFLASH_DEFER_CONTEXT": value}) is expected
    assert read("DFLASH_DEFER_CONTEXT", {}) is True  # its default
    assert read("DFLASH_DEFER_CONTEXT", {"DFLASH_DEFER_CONTEXT": ""}) is True  # empty = unset
    with pytest.raises(SwitchError, match="DFLASH_DEFER_CONTEXT='maybe': expected on or off"):
        read("DFLASH_DEFER_CONTEXT", {"DFLASH_DEFER_CONTEXT": "maybe"})


def test_choices_counts_paths_and_text():
    from dflash_plugin.draft_policy import PolicyMode

    policy = switches.BY_NAME["DFLASH_DRAFT_POLICY"]
    assert policy.choices == tuple(mode.value for mode in PolicyMode)
    assert read("DFLASH_DRAFT_POLICY", {"DFLASH_DRAFT_POLICY": "Full"}) == "full"
    with pytest.raises(SwitchError, match="DFLASH_DRAFT_POLICY='stagger': expected one of "
                                          "adaptive, full, off"):
        read("DFLASH_DRAFT_POLICY", {"DFLASH_DRAFT_POLICY": "stagger"})
    assert read("DFLASH_STATS_EVERY", {}) == 2000
    assert read("DFLASH_STATS_EVERY", {"DFLASH_STATS_EVERY": "0"}) == 0
    for bad in ("-5", "many", "1.5"):
        with pytest.raises(SwitchError, match="DFLASH_STATS_EVERY="):
            read("DFLASH_STATS_EVERY", {"DFLASH_STATS_EVERY": bad})
    assert read("DFLASH_COST_MODEL", {}) is None
    assert read("DFLASH_HOME", {}) == Path.home() / ".cache" / "dflash-plugin"
    assert read("DFLASH_SOURCES", {"DFLASH_HOME": "/data/d"}) == Path("/data/d/sources")
    assert read("DFLASH_SOURCES", {"DFLASH_SOURCES": "~/s"}) == Path.home() / "s"
    with pytest.raises(KeyError, match="DFLASH_NOPE is not declared"):
        read("DFLASH_NOPE", {})


def test_a_bad_cost_model_names_its_variable(monkeypatch):
    from vllm_ext.drafting import cost_model_from_env

    monkeypatch.setenv("DFLASH_COST_MODEL", "draft_fixed=cheap")
    with pytest.raises(SwitchError, match="DFLASH_COST_MODEL: cost model override"):
        cost_model_from_env(is_cpu=True)


def test_the_generated_table_is_one_row_per_switch():
    lines = switches.markdown_table().splitlines()
    assert lines[0] == "| variable | values | default | meaning |"
    assert len(lines) == 2 + len(SWITCHES)
