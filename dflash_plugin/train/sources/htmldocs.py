"""HTML documents cut into sections at <h1>-<h3> headings, with <pre> blocks kept as code."""

from __future__ import annotations

import html
import re

from dflash_plugin.train.sources.docs import Section
from dflash_plugin.train.sources.text import html_text, paragraphs

_HEADING = re.compile(r"<h([1-3])[^>]*>(.*?)</h\1>", re.S | re.I)
_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S | re.I)


def html_sections(source: str) -> list[Section]:
    source = re.sub(r"<(script|style|head)\b.*?</\1>", " ", source, flags=re.S | re.I)
    parts = _HEADING.split(source)
    sections = [_section("", parts[0])]
    for i in range(1, len(parts) - 2, 3):
        title = " ".join(html.unescape(re.sub(r"<[^>]+>", "", parts[i + 1])).split())
        sections.append(_section(title, parts[i + 2]))
    return [s for s in sections if s.prose or s.code]


def _section(title: str, body: str) -> Section:
    code = [html.unescape(re.sub(r"<[^>]+>", "", m)).strip("\n") for m in _PRE.findall(body)]
    prose = paragraphs(html_text(_PRE.sub("\n\n", body)))
    return Section(title, [p for p in prose if len(p.split()) >= 5], [c for c in code if c])
