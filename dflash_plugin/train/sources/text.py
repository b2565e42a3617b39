"""Plain-text helpers shared by the source readers: markup removal and passage chunking."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

# A passage long enough to summarise, short enough that prompt plus a long answer fit a
# 2,048-token context (about 1.3 tokens per English word).
MIN_WORDS, MAX_WORDS = 80, 320


def words(text: str) -> int:
    return len(text.split())


def squash(text: str) -> str:
    """Collapse runs of spaces inside lines and of blank lines, strip the ends."""
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" *\n *", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each joined onto one line."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def chunk_paragraphs(paras: list[str], lo: int = MIN_WORDS, hi: int = MAX_WORDS) -> list[str]:
    """Consecutive paragraphs grouped into passages of lo..hi words (a longer paragraph is
    cut at sentence ends); a short tail is dropped."""
    out, cur, n = [], [], 0
    for para in paras:
        pieces = [para] if words(para) <= hi else _sentences_upto(para, hi)
        for piece in pieces:
            w = words(piece)
            if n and n + w > hi:
                if n >= lo:
                    out.append("\n\n".join(cur))
                cur, n = [], 0
            cur.append(piece)
            n += w
    if n >= lo:
        out.append("\n\n".join(cur))
    return out


def _sentences_upto(para: str, hi: int) -> list[str]:
    parts, cur = [], []
    for sentence in re.split(r"(?<=[.!?])\s+", para):
        if cur and words(" ".join(cur + [sentence])) > hi:
            parts.append(" ".join(cur))
            cur = []
        cur.append(sentence)
    if cur:
        parts.append(" ".join(cur))
    return [p for p in parts if words(p) <= hi]


def is_english(text: str) -> bool:
    """Cheap filter: mostly ASCII letters and a few very common English words."""
    letters = [c for c in text if c.isalpha()]
    if not letters or sum(c.isascii() for c in letters) / len(letters) < 0.97:
        return False
    common = sum(w in _COMMON for w in re.findall(r"[a-z]+", text.lower()))
    return common >= max(2, words(text) // 20)


_COMMON = frozenset("the of and to a in is that it for as with be on are this by or from an "
                    "not can you your if when which at".split())


# -- reStructuredText (Python docs) ------------------------------------------------------------

_ROLE = re.compile(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^`>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")


def rst_inline(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r"\[#[\w-]*\]_", "", text)
    return text.replace("\\*", "*")


# -- roff (man pages) ---------------------------------------------------------------------------

_ROFF_ESCAPES = {r"\-": "-", r"\(aq": "'", r"\(dq": '"', r"\(em": "--", r"\(en": "-",
                 r"\(lq": '"', r"\(rq": '"', r"\(oq": "'", r"\(cq": "'", r"\e": "\\",
                 r"\&": "", r"\~": " ", r"\ ": " ", r"\(bu": "*", r"\(co": "(c)", r"\|": "",
                 r"\(ga": "`", r"\(ti": "~", r"\(ha": "^", r"\(rs": "\\", r"\(mu": "x",
                 r"\(+-": "+-", r"\(>=": ">=", r"\(<=": "<=", r"\(!=": "!=", r"\,": "",
                 r"\/": "", r"\:": "", r"\^": ""}


def roff_inline(line: str) -> str:
    line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", line)
    line = re.sub(r"\\\*\((..)|\\\*\[[^\]]*\]|\\\*.", "", line)
    for esc, rep in _ROFF_ESCAPES.items():
        line = line.replace(esc, rep)
    line = re.sub(r"\\\[[a-z]+\]", "", line)
    return line.replace("\\\\", "\\")


def roff_sections(source: str) -> list[tuple[str, str, bool]]:
    """(heading, text, is_code) blocks of a man page: prose per .SH/.SS section, and every
    .EX/.EE or .nf/.fi block on its own as code."""
    out: list[tuple[str, str, bool]] = []
    heading, buf, code, in_code = "", [], [], False

    def flush():
        if buf:
            out.append((heading, squash("\n".join(buf)), False))
            buf.clear()

    for raw in source.splitlines():
        if raw.startswith(('.\\"', "'\\\"")):
            continue
        if in_code:
            if raw.startswith((".EE", ".fi")):
                out.append((heading, "\n".join(code).strip("\n"), True))
                code, in_code = [], False
            elif not raw.startswith(".") or raw.startswith(".."):
                code.append(roff_inline(raw))
            continue
        if raw.startswith((".EX", ".nf")):
            flush()
            in_code = True
            continue
        if raw.startswith((".SH", ".SS")):
            flush()
            heading = roff_inline(raw[3:].strip().strip('"'))
            continue
        if raw.startswith((".PP", ".P ", ".LP", ".TP", ".IP", ".sp", ".br")) or raw in (".P",):
            buf.append("")
            rest = raw.split(None, 1)[1] if raw.startswith(".IP") and " " in raw else ""
            if rest:
                buf.append(roff_inline(rest.split('"')[1] if '"' in rest else rest.split()[0]))
            continue
        if raw.startswith((".B ", ".I ", ".BR ", ".BI ", ".IR ", ".RB ", ".RI ", ".IB ")):
            parts = re.findall(r'"[^"]*"|\S+', raw.split(None, 1)[1]) if " " in raw else []
            buf.append("".join(p.strip('"') for p in parts))
            continue
        if raw.startswith("."):
            continue
        buf.append(roff_inline(raw))
    flush()
    return out


# -- HTML ----------------------------------------------------------------------------------------

class _TextCollector(HTMLParser):
    SKIP = {"script", "style", "head", "nav"}
    BLOCK = {"p", "div", "li", "pre", "h1", "h2", "h3", "h4", "table", "tr", "br", "dd", "dt",
             "blockquote", "ul", "ol"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_text(source: str) -> str:
    collector = _TextCollector()
    collector.feed(source)
    return html.unescape("".join(collector.parts))
