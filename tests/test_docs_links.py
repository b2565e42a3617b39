"""The user-facing documents stay navigable and current: every relative link resolves, the README
stays short, carries no measurement history, and states the engine versions the code supports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODEL_CARD = ROOT / "dflash_plugin/drafters/SmolLM2-135M-Instruct-DFlash-b16/README.md"
README_MAX_LINES = 200

# [text](target) and reference definitions "[label]: target"; images use the same syntax.
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, mailto:, //host
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
# Numbered work periods belong in docs/history.md only.
HISTORY_WORDS = re.compile(r"\b(session|round)[\s_-]*\d+", re.IGNORECASE)


def documents() -> list[Path]:
    return [README, MODEL_CARD, ROOT / "train_data/smollm2-135m/README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def relative_links(text: str) -> list[str]:
    text = FENCE.sub("", text)  # code blocks hold shell, not links
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    return [t for t in targets if not EXTERNAL.match(t) and not t.startswith("#")]


def test_link_pattern_finds_relative_links_only():
    text = ("[a](docs/x.md) [b](https://e.org/y) ![c](bench/p.png#top) [d](#anchor)\n"
            "[e]: ../f.json\n```\n[g](not/a/link.md)\n```\n")
    assert relative_links(text) == ["docs/x.md", "bench/p.png#top", "../f.json"]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in relative_links(doc.read_text()):
        path = target.split("#", 1)[0]
        if path and not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("doc", [README, MODEL_CARD], ids=["README.md", "model card"])
def test_no_measurement_history_in_user_documents(doc):
    found = HISTORY_WORDS.findall(doc.read_text())
    assert not found, f"{doc.name}: history words {found}; they belong in docs/history.md"


def test_readme_states_the_supported_engine_versions():
    from sglang_ext.versions import TESTED_SGLANG
    from vllm_ext.plugin import SUPPORTED_VLLM

    text = README.read_text()
    ranges = []
    for span in re.findall(r"`([<>=~!][^`]*)`", text):
        try:
            ranges.append(SpecifierSet(span))
        except InvalidSpecifier:
            pass
    assert SUPPORTED_VLLM in ranges, f"README.md should name the supported vLLM range {SUPPORTED_VLLM}"
    assert f"SGLang {TESTED_SGLANG}" in text
