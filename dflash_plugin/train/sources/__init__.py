"""Real-source training prompts: readers for text and code shipped in Debian packages (one
module per source family), task templates (tasks.py) and the builder (builder.py)."""

from __future__ import annotations

import importlib
from typing import Callable

from dflash_plugin.train.sources.base import Material, SourceInfo

# name -> (module, its SourceInfo attribute, its materials function)
_REGISTRY = {
    "wordnet": ("wordnet", "INFO", "materials"),
    "pydocs": ("pydocs", "INFO", "materials"),
    "stdlib": ("stdlib", "INFO", "materials"),
    "manpages": ("manpages", "INFO", "materials"),
    "manpages-dev": ("manpages_dev", "INFO", "materials"),
    "gitman": ("gitman", "INFO", "materials"),
    "rustdocs": ("rustdocs", "INFO", "materials"),
    "gosrc": ("godocs", "SRC", "src_materials"),
    "gospec": ("godocs", "SPEC", "spec_materials"),
    "austen": ("austen", "INFO", "materials"),
    "webbible": ("webbible", "INFO", "materials"),
    "devil": ("devil", "INFO", "materials"),
    "jargon": ("jargon", "INFO", "materials"),
    "foldoc": ("foldoc", "INFO", "materials"),
    "vera": ("vera", "INFO", "materials"),
    "miscfiles": ("miscfiles", "INFO", "materials"),
    "perldocs": ("perldocs", "INFO", "materials"),
    "sqlitedocs": ("sqlitedocs", "INFO", "materials"),
    "nodedocs": ("nodedocs", "INFO", "materials"),
    "networkx": ("networkx", "INFO", "materials"),
    "debref": ("debdocs", "REFERENCE", "reference_materials"),
    "debfaq": ("debdocs", "FAQ", "faq_materials"),
    "arithmetic": ("generated", "ARITHMETIC", None),
    "algebra": ("generated", "ALGEBRA", None),
    "reasoning": ("generated", "REASONING", None),
}
SOURCE_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def source(name: str) -> tuple[SourceInfo, Callable]:
    """(info, materials function) of a source; generated sources take no package root."""
    if name not in _REGISTRY:
        raise KeyError(name)
    module_name, info_attr, fn_name = _REGISTRY[name]
    module = importlib.import_module(f"dflash_plugin.train.sources.{module_name}")
    info = getattr(module, info_attr)
    if fn_name is None:
        return info, lambda root, rng: module.problems(name, rng)
    return info, getattr(module, fn_name)


__all__ = ["Material", "SourceInfo", "SOURCE_NAMES", "source"]
