"""GNU miscfiles (Debian miscfiles): countries with their capitals, world cities with
coordinates (for distance problems), and the US Constitution and Declaration of Independence
(public domain) as passages."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.text import chunk_paragraphs, paragraphs

INFO = SourceInfo("miscfiles", "miscfiles",
                  "GPL-2+ (tables); the US state papers are public domain")


def _lines(path: Path) -> list[str]:
    return gzip.open(path, "rt", encoding="utf-8", errors="replace").read().splitlines()


def cities(root: Path) -> list[dict]:
    out, rec = [], {}
    for line in _lines(root / "usr/share/misc/cities.dat.gz") + ["//"]:
        if line.startswith("//"):
            if rec.get("Name") and rec.get("Latitude") and rec.get("Country"):
                out.append(rec)
            rec = {}
        elif ":" in line:
            key, _, value = line.partition(":")
            rec[key.strip()] = value.strip()
    return out


def materials(root: Path, rng: random.Random) -> list[Material]:
    out, names = [], {"UK": "United Kingdom"}
    for line in _lines(root / "usr/share/misc/countries.gz"):
        parts = line.split(":")
        if line.startswith("#") or len(parts) < 5 or not parts[4].strip():
            continue
        country, capital = parts[3].strip(), parts[4].strip()
        names.setdefault(parts[1].strip(), country)
        out.append(Material("country", {"country": country, "capital": capital},
                            f"country:{country}"))
    places = cities(root)
    for i in range(min(800, len(places) ** 2)):
        a, b = rng.sample(places, 2)
        fields = {"a": f"{a['Name']}, {names.get(a['Country'], a['Country'])}",
                  "b": f"{b['Name']}, {names.get(b['Country'], b['Country'])}",
                  "lat_a": a["Latitude"], "lon_a": a["Longitude"],
                  "lat_b": b["Latitude"], "lon_b": b["Longitude"]}
        out.append(Material("city_pair", fields, f"cities:{a['Name']}:{b['Name']}"))
    for name, work in (("us-constitution", "the US Constitution"),
                       ("us-declaration", "the US Declaration of Independence")):
        text = "\n".join(_lines(root / f"usr/share/state/{name}.gz"))
        for i, passage in enumerate(chunk_paragraphs(paragraphs(text), 60, 260)):
            out.append(Material("old_text_passage", {"passage": passage, "work": work,
                                                     "title": work}, f"{name}:{i}"))
    return list({m.key: m for m in out}.values())
