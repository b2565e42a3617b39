"""Technical documents cut into sections, and sections turned into materials: a section's
prose becomes passages, its title a topic, its code blocks code, FAQ headings questions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dflash_plugin.train.sources.base import Material
from dflash_plugin.train.sources.text import chunk_paragraphs, is_english, paragraphs, rst_inline


@dataclass
class Section:
    title: str
    prose: list[str] = field(default_factory=list)   # paragraphs
    code: list[str] = field(default_factory=list)    # code blocks


_UNDERLINE = re.compile(r"^([=\-~^\"'*+#`])\1{2,}\s*$")


def rst_sections(text: str) -> list[Section]:
    lines = text.splitlines()
    sections, cur, para, i = [], Section(""), [], 0

    def end_para():
        if para:
            cur.prose.append(rst_inline(" ".join(para)))
            para.clear()

    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and _UNDERLINE.match(nxt) and len(nxt.strip()) >= len(line.strip()) - 2 \
                and not _UNDERLINE.match(line):
            end_para()
            sections.append(cur)
            cur = Section(rst_inline(line.strip()))
            i += 2
            continue
        if _UNDERLINE.match(line):
            i += 1
            continue
        if line.startswith(".. ") or line.rstrip().endswith("::"):
            is_literal = line.rstrip().endswith("::") and not line.startswith(".. ")
            is_code_directive = re.match(r"\.\. (code-block|sourcecode|code|doctest|testcode)::",
                                         line)
            if is_literal:
                head = line.rstrip()[:-1].rstrip(":").rstrip()
                if head.strip():
                    para.append(head.strip() + ":")
            end_para()
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            body = [b for b in block if not re.match(r"\s+:\w[\w-]*:", b)]
            if is_literal or is_code_directive:
                code = _dedent(body)
                if code:
                    cur.code.append(code)
            continue
        if not line.strip():
            end_para()
        elif not line.startswith(("   ", "\t")) or para:
            para.append(line.strip())
        i += 1
    end_para()
    sections.append(cur)
    return [s for s in sections if s.prose or s.code]


def markdown_sections(text: str) -> list[Section]:
    sections, cur, para, code, fence = [], Section(""), [], [], None
    for line in text.splitlines():
        if fence is not None:
            if line.startswith("```"):
                cur.code.append("\n".join(code).strip("\n"))
                code, fence = [], None
            else:
                code.append(line)
            continue
        if line.startswith("```"):
            if para:
                cur.prose.append(" ".join(para))
                para = []
            fence = line[3:].strip()
            continue
        heading = re.match(r"#{1,4}\s+(.*)", line)
        if heading:
            if para:
                cur.prose.append(" ".join(para))
                para = []
            sections.append(cur)
            cur = Section(heading.group(1).strip().strip("#").strip())
        elif not line.strip():
            if para:
                cur.prose.append(" ".join(para))
                para = []
        elif not line.startswith(("<!--", "{{#", "[")):
            para.append(line.strip())
    if para:
        cur.prose.append(" ".join(para))
    sections.append(cur)
    for s in sections:
        s.prose = [_md_inline(p) for p in s.prose]
    return [s for s in sections if s.prose or s.code]


def _md_inline(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\[[^\]]*\]|\[([^\]]+)\]\([^)]*\)",
                  lambda m: m.group(1) or m.group(2), text)
    return re.sub(r"<!--.*?-->|<[^>]+>", "", text)


def pod_sections(text: str) -> list[Section]:
    sections, cur, para, in_code = [], Section(""), [], []
    for block in re.split(r"\n\s*\n", text):
        if block.startswith("=head"):
            sections.append(cur)
            cur = Section(_pod_inline(block.split(None, 1)[1] if " " in block else ""))
        elif block.startswith("="):
            continue
        elif block.startswith((" ", "\t")):
            if cur.code and in_code is cur:
                cur.code[-1] += "\n\n" + _dedent(block.splitlines())
            else:
                cur.code.append(_dedent(block.splitlines()))
                in_code = cur
            continue
        else:
            cur.prose.append(_pod_inline(" ".join(block.split())))
        in_code = None
    sections.append(cur)
    del para
    return [s for s in sections if s.prose or s.code]


def _pod_inline(text: str) -> str:
    for _ in range(3):
        text = re.sub(r"[A-Z]<<+\s*(.*?)\s*>>+|[A-Z]<([^<>]*)>",
                      lambda m: (m.group(1) or m.group(2) or "").split("|")[0], text)
    return text.strip()


def numbered_text_sections(text: str) -> list[Section]:
    """Plain text with numbered headings ("12.1.3. Shell conditionals") and indented code."""
    sections, cur = [], Section("")
    for block in re.split(r"\n\s*\n", text):
        heading = re.match(r"\s*(?:\d+\.)+\d*\.?\s+([A-Z].{2,80})$", block.strip())
        if heading and "\n" not in block.strip():
            sections.append(cur)
            cur = Section(heading.group(1).strip())
            continue
        lines = block.splitlines()
        if any(l.strip().startswith(("+--", "|", "│")) for l in lines):
            continue  # ASCII tables read badly as prose or code
        if any(l.strip().startswith(("$ ", "# ")) for l in lines):
            cur.code.append(_dedent(lines))
        else:
            cur.prose.append(" ".join(block.split()))
    sections.append(cur)
    return [s for s in sections if s.prose or s.code]


def _dedent(lines: list[str]) -> str:
    lines = [l.rstrip() for l in lines]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    pad = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
    return "\n".join(l[pad:] for l in lines)


GENERIC_TITLES = frozenset(
    "introduction examples example see also notes note description synopsis overview contents "
    "footnotes summary methods functions constants exceptions attributes classes name options "
    "usage background details discussion author authors bugs history copyright license "
    "availability return value errors files environment conforming to versions".split()
    + ["see also", "return value", "conforming to", "further reading", "other resources"])


def _clean_title(title: str) -> str:
    title = re.sub(r"^[\d.]+\s+", "", title).strip(" :`*")
    return title.replace("``", "`")


def section_materials(sections: list[Section], *, key: str, domain: str, work: str,
                      lang: str | None = None, code_lines: tuple[int, int] = (4, 40),
                      min_words: int = 80) -> list[Material]:
    """passages ("tech_passage"), topics ("tech_topic"), questions ("question") and code
    blocks ("code") from one document's sections."""
    out = []
    for n, s in enumerate(sections):
        title = _clean_title(s.title)
        prose = [p for p in s.prose if len(p.split()) >= 6 and is_english(p)]
        if title.endswith("?") and 3 <= len(title.split()) <= 30:
            answer = " ".join(prose)[:1500]
            out.append(Material("question", {"question": title, "domain": domain,
                                             "answer": answer}, f"{key}:q:{title}"))
        elif title and 1 <= len(title.split()) <= 8 and prose and not title.isupper() \
                and title.lower() not in GENERIC_TITLES:
            out.append(Material("tech_topic", {"topic": title, "domain": domain, "work": work},
                                f"{key}:t:{title}"))
        for i, passage in enumerate(chunk_paragraphs(prose, min_words, 300)):
            out.append(Material("tech_passage", {"passage": passage, "domain": domain,
                                                 "work": work, "topic": title or work},
                                f"{key}:p:{n}:{i}"))
        if lang:
            for i, code in enumerate(s.code):
                n_lines = code.count("\n") + 1
                if code_lines[0] <= n_lines <= code_lines[1] and len(code) < 1800:
                    out.append(Material("code", {"code": code, "lang": lang, "domain": domain,
                                                 "topic": title or work},
                                        f"{key}:c:{n}:{i}"))
    return out
