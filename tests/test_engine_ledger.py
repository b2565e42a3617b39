"""docs/engine-ledger.md against the adapters' code (grep-based, no engine): every ledger entry
names code and tests that exist and carry its id, and every place where the adapters patch,
subclass, re-register or read a private part of vLLM or SGLang names a ledger entry nearby."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "docs" / "engine-ledger.md"
ADAPTERS = ("vllm_ext", "sglang_ext")
KINDS = {"patch", "subclass", "registry override", "contract", "private read", "private write",
         "runtime hook"}
ID = re.compile(r"[PSRAH]\d+")
WINDOW = 8  # lines above a site that may name its entry (a comment, a docstring line)

# What counts as a site: patches and their guards, registrations, subclasses of engine classes,
# and attributes named private (_x) read from anything but the adapter's own objects.
SITE_PATTERNS = (
    re.compile(r"\bpatch_method\("),
    re.compile(r"\b(hook_problems|signature_problems)\((?!owner)"),
    re.compile(r"\bregister_model\(|\bregistry\.register\(|_require\(registry, \"register\""),
    re.compile(r"^class \w+\((DFlashQwen3\w*|MultiprocExecutor)\)"),
    re.compile(r"super\(\)\._[a-z]\w*"),
    # private names of engine objects; `_dflash*` are the plugin's own marks, `_base` is torch's
    re.compile(r"\b(?!self\b)[a-z]\w*\.(?!_dflash)(?!_base\b)_[a-z]\w*"),
)


def ledger_rows() -> list[dict[str, str]]:
    columns = ["id", "engine", "target", "kind", "why", "guard", "test", "code"]
    rows = []
    for line in LEDGER.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not ID.fullmatch(cells[0]):
            continue
        assert len(cells) == len(columns), f"ledger row with {len(cells)} cells: {line}"
        rows.append(dict(zip(columns, cells)))
    return rows


def paths_in(cell: str) -> list[str]:
    return re.findall(r"`([\w/.]+\.py)(?:::\w+)?`", cell)


def test_each_entry_is_complete_and_points_at_existing_code_and_tests():
    rows = ledger_rows()
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)) and len(ids) >= 10
    for row in rows:
        assert row["engine"] in ("vLLM", "SGLang", "CPython"), row
        assert row["kind"] in KINDS, row
        assert all(row[c] for c in ("target", "why", "guard")), row
        for path in paths_in(row["code"]):
            assert (ROOT / path).is_file(), (row["id"], path)
            assert re.search(rf"\b{row['id']}\b", (ROOT / path).read_text()), \
                f"{row['id']} is not named in {path}"
        assert paths_in(row["code"]), row
        tests = re.findall(r"`(tests/[\w/.]+\.py)(?:::(\w+))?`", row["test"])
        assert tests, f"{row['id']} names no test"
        for path, name in tests:
            text = (ROOT / path).read_text()
            assert not name or f"def {name}(" in text, (row["id"], path, name)


def _own_modules(text: str) -> set[str]:
    """Names a file binds to this project's own modules (their private names are not engines')."""
    own = set(re.findall(r"^\s*import (?:vllm_ext|sglang_ext|dflash_plugin)\.\w+ as (\w+)", text,
                         re.M))
    for names in re.findall(r"^\s*from (?:vllm_ext|sglang_ext|dflash_plugin) import ([\w, ]+)",
                            text, re.M):
        own |= {name.split(" as ")[-1].strip() for name in names.split(",")}
    return own


def _sites(text: str) -> list[tuple[int, str]]:
    lines = text.splitlines()
    own = _own_modules(text)
    found = []
    for number, line in enumerate(lines):
        code = line.split("#")[0]
        if code.lstrip().startswith(("def ", '"""')) or not code.strip():
            continue
        for pattern in SITE_PATTERNS:
            match = pattern.search(code)
            if match and match.group(0).split(".")[0] not in own:
                found.append((number, line))
                break
    return found


def test_every_patch_subclass_registration_and_private_read_names_its_entry():
    by_file: dict[str, set[str]] = {}
    for row in ledger_rows():
        for path in paths_in(row["code"]):
            by_file.setdefault(path, set()).add(row["id"])
    unnamed = []
    for package in ADAPTERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            lines = path.read_text().splitlines()
            for number, line in _sites(path.read_text()):
                nearby = " ".join(lines[max(0, number - WINDOW):number + 1])
                if not set(ID.findall(nearby)) & by_file.get(relative, set()):
                    unnamed.append(f"{relative}:{number + 1}: {line.strip()}")
    assert not unnamed, ("name the docs/engine-ledger.md entry (or add one) near:\n"
                         + "\n".join(unnamed))


def test_the_site_patterns_find_what_they_are_meant_to():
    sample = ("class D(DFlashQwen3Model):\n"
              "x = proposer._context_slot_mapping_buffer\n"
              "y = self._own\n"
              "z = proposer._dflash_checked\n"
              "return super()._normalize_context_k(k)\n"
              "ModelRegistry.register_model(A, B)\n"
              "from vllm_ext import plugin\n"
              "if plugin._registered: pass\n")
    assert [n for n, _ in _sites(sample)] == [0, 1, 4, 5]
