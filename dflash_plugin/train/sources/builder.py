"""Build a prompt set from real sources: no source and no task family above a share cap,
near-duplicates and evaluation overlaps dropped, seeded and reproducible."""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dflash_plugin.errors import DFlashError
from dflash_plugin.train.prompts import Prompt
from dflash_plugin.train.sources import SOURCE_NAMES, source
from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.contamination import EvalIndex
from dflash_plugin.train.sources.dedup import NearDuplicates
from dflash_plugin.train.sources.fetch import Package, cached_package, fetch_package
from dflash_plugin.train.sources.tasks import BY_KIND, BY_NAME, category_of, fill, ready

MAX_SHARE = 0.05
MAX_CATEGORY_SHARE = 0.25  # code-heavy sources outnumber the others; keep a mix
MAX_CHARS = 3000    # prompt plus a 1,024-token answer stay inside a 2,048-token context
MAX_USES = 3        # a material may serve this many different task families


@dataclass
class BuildReport:
    requested: int
    sources: dict[str, dict] = field(default_factory=dict)   # name -> package, version, licence
    skipped_sources: dict[str, str] = field(default_factory=dict)
    candidates: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    contaminated: int = 0
    contamination_examples: list[dict] = field(default_factory=list)
    resembling_eval: int = 0
    resemblance_examples: list[dict] = field(default_factory=list)
    too_long: int = 0
    eval_files: list[str] = field(default_factory=list)
    by_category: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)
    by_task: dict[str, int] = field(default_factory=dict)
    followups: int = 0

    @property
    def duplicate_rate(self) -> float:
        return (self.exact_duplicates + self.near_duplicates) / max(1, self.candidates)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d["duplicate_rate"] = round(self.duplicate_rate, 4)
        return d


def _normal(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _prompt_id(source_name: str, text: str) -> str:
    return f"{source_name}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def load_materials(names: list[str], *, seed: int, cache: Path | None = None,
                   fetch: bool = True, report: BuildReport | None = None
                   ) -> dict[str, list[Material]]:
    """Materials per source, shuffled with a per-source seed; a source whose package is not
    in the cache (and may not be fetched) is skipped and noted in the report."""
    out = {}
    for name in names:
        info, materials = source(name)
        root = None
        if info.package != "generated":
            pkg: Package | None = (fetch_package(info.package, cache) if fetch
                                   else cached_package(info.package, cache))
            if pkg is None:
                if report is not None:
                    report.skipped_sources[name] = f"{info.package} is not in the source cache"
                continue
            root, version = pkg.root, pkg.version
        else:
            version = "-"
        rng = random.Random(f"dflash-sources:{seed}:{name}")
        items = sorted(materials(root, rng), key=lambda m: m.key)
        rng.shuffle(items)
        out[name] = _interleave_kinds(items)
        if report is not None:
            report.sources[name] = {"package": info.package, "version": version,
                                    "licence": info.licence, "materials": len(items)}
    return out


def _interleave_kinds(items: list[Material]) -> list[Material]:
    """Round-robin over material kinds, so a source's small kinds (jobs, dishes) are not
    crowded out by its large ones (words) before the source reaches its cap."""
    by_kind: dict[str, list[Material]] = {}
    for m in items:
        by_kind.setdefault(m.kind, []).append(m)
    groups = [by_kind[k] for k in sorted(by_kind)]
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


def _families(material: Material) -> list[str]:
    if material.kind == "ready":
        return [material.fields["task"]]
    return [f.name for f in BY_KIND.get(material.kind, [])]


def _category(family: str, material: Material) -> str:
    if material.kind == "ready":
        return material.fields["category"]
    return category_of(BY_NAME[family], material.fields)


def select_prompts(materials: dict[str, list[Material]], num_prompts: int, *, seed: int,
                   eval_index: EvalIndex | None = None, followup_rate: float = 0.15,
                   max_share: float = MAX_SHARE, max_category_share: float = MAX_CATEGORY_SHARE,
                   dedup_threshold: float = 0.8, report: BuildReport | None = None
                   ) -> list[Prompt]:
    """Up to num_prompts prompts taken round-robin over the sources: each material gets the
    least-used of two random task families it fits; no source or family exceeds max_share."""
    report = report or BuildReport(num_prompts)
    # With fewer sources or families than 1/max_share, the cap widens so the set can fill.
    sample = [(f, m) for items in materials.values() for m in items[:2000] for f in _families(m)]
    families = {f for f, _ in sample}
    categories = {_category(f, m) for f, m in sample}
    source_cap = max(1, int(max(max_share, 1 / max(1, len(materials))) * num_prompts))
    cap = max(1, int(max(max_share, 1 / max(1, len(families))) * num_prompts))
    category_cap = max(1, int(max(max_category_share, 1 / max(1, len(categories)))
                              * num_prompts))
    rng = random.Random(f"dflash-select:{seed}")
    near = NearDuplicates(threshold=dedup_threshold)
    seen: set[str] = set()
    by_source, by_task, by_category = Counter(), Counter(), Counter()
    used: set[tuple[str, str]] = set()
    queues = {name: list(items) for name, items in materials.items()}
    passes = dict.fromkeys(queues, 0)
    cursor = dict.fromkeys(queues, 0)
    out: list[Prompt] = []
    active = [n for n in queues if queues[n]]
    while active and len(out) < num_prompts:
        for name in list(active):
            if len(out) >= num_prompts:
                break
            if by_source[name] >= source_cap:
                active.remove(name)
                continue
            if cursor[name] >= len(queues[name]):
                passes[name] += 1
                cursor[name] = 0
                if passes[name] >= MAX_USES:
                    active.remove(name)
                    continue
            material = queues[name][cursor[name]]
            cursor[name] += 1
            options = [f for f in _families(material)
                       if by_task[f] < cap and (material.key, f) not in used
                       and by_category[_category(f, material)] < category_cap]
            if not options:
                continue
            pair = rng.sample(options, min(2, len(options)))
            family = min(pair, key=lambda f: (by_task[f], by_category[_category(f, material)]))
            used.add((material.key, family))
            if material.kind == "ready":
                text, category, followup = ready(material.fields, rng, followup_rate)
            else:
                text, category, followup = fill(BY_NAME[family], material.fields, rng,
                                                followup_rate)
            report.candidates += 1
            if len(text) > MAX_CHARS:
                report.too_long += 1
                continue
            norm = _normal(text)
            if norm in seen:
                report.exact_duplicates += 1
                continue
            sig = near.signature(text)
            if eval_index is not None and eval_index.resembles(text, sig):
                report.resembling_eval += 1
                if len(report.resemblance_examples) < 12:
                    report.resemblance_examples.append({"source": name, "task": family,
                                                        "text": text[:200]})
                continue
            if eval_index is not None and eval_index.hits(text):
                report.contaminated += 1
                shared = eval_index.shared(text)[0]
                if len(report.contamination_examples) < 12 and shared not in {
                        e["shared"] for e in report.contamination_examples}:
                    report.contamination_examples.append(
                        {"source": name, "task": family, "shared": shared})
                continue
            pid = _prompt_id(name, text)
            if not near.add(text, pid, signature=sig):
                report.near_duplicates += 1
                continue
            seen.add(norm)
            by_category[category] += 1
            by_source[name] += 1
            by_task[family] += 1
            out.append(Prompt(pid, category, text, source=name, task=family,
                              followup=followup))
    report.by_category = dict(sorted(Counter(p.category for p in out).items()))
    report.by_source = dict(sorted(by_source.items()))
    report.by_task = dict(sorted(by_task.items()))
    report.followups = sum(p.followup is not None for p in out)
    return out


def build_real_prompts(num_prompts: int, *, sources: list[str] | None = None, seed: int = 0,
                       cache: Path | None = None, fetch: bool = True,
                       eval_files: list[Path] = (), followup_rate: float = 0.15,
                       max_share: float = MAX_SHARE) -> tuple[list[Prompt], BuildReport]:
    """The whole prompts stage for the real generator: load, select, check, report."""
    if num_prompts < 1:
        raise DFlashError(f"--num-prompts must be at least 1, got {num_prompts}")
    names = list(sources or SOURCE_NAMES)
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if unknown:
        raise DFlashError(f"unknown prompt source(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(SOURCE_NAMES)}")
    report = BuildReport(num_prompts)
    materials = load_materials(names, seed=seed, cache=cache, fetch=fetch, report=report)
    if not materials:
        raise DFlashError("no prompt source could be loaded: "
                          + "; ".join(f"{k}: {v}" for k, v in report.skipped_sources.items()))
    report.eval_files = [str(p) for p in eval_files]
    index = EvalIndex.from_files(list(eval_files)) if eval_files else None
    prompts = select_prompts(materials, num_prompts, seed=seed, eval_index=index,
                             followup_rate=followup_rate, max_share=max_share, report=report)
    if index is not None and any(index.hits(p.text) for p in prompts):
        raise AssertionError("a prompt overlapping the evaluation files was kept")
    return prompts, report


def source_info(name: str) -> SourceInfo:
    return source(name)[0]
