"""Every DFLASH_* environment variable, declared once: its values, default and meaning.

The code reads them only through `read` / `is_set` here (tests/test_switch_table.py checks that,
and that the README's "Environment switches" table lists the same names, defaults and meanings;
`markdown_table()` writes that table). A value outside a variable's declared values raises
`SwitchError`, which names the variable. Shell scripts may read their own variables directly,
but those are declared here too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dflash_plugin.errors import DFlashError

ON = ("on", "1", "true")
OFF = ("off", "0", "false")


class SwitchError(DFlashError, ValueError):
    """An environment variable holds a value outside its declared values."""


@dataclass(frozen=True)
class Switch:
    name: str
    kind: str  # "on/off", "choice", "count" (whole number >= 0), "text", "path", "flag" (shell)
    default: str | None  # as it would be written in the environment; None: unset
    meaning: str
    choices: tuple[str, ...] = ()

    @property
    def values(self) -> str:
        """The values column of the README's table."""
        return {"on/off": "on, off", "choice": ", ".join(self.choices),
                "count": "whole number >= 0", "text": "text", "path": "path",
                "flag": "any non-empty value"}[self.kind]

    @property
    def shown_default(self) -> str:
        return "unset" if self.default is None else self.default


# One row per variable; the order is the README's.
SWITCHES = (
    Switch("DFLASH_DRAFT_POLICY", "choice", "adaptive",
           "vLLM plugin: draft lengths from the cost model (adaptive), vLLM's full blocks (full), "
           "or never verify drafts (off)", ("adaptive", "full", "off")),
    Switch("DFLASH_COST_MODEL", "text", None,
           "vLLM plugin: overrides fields of the platform's cost preset, "
           "`verify_per_token=0.09,draft_fixed=0.15,...`"),
    Switch("DFLASH_DRAFT_VOCAB", "choice", "auto",
           "vLLM plugin: draft over the checkpoint's training vocabulary (`draft_vocab.json`) when "
           "it has one (auto), or over the whole vocabulary (full)", ("auto", "full")),
    Switch("DFLASH_DEFER_CONTEXT", "on/off", "on",
           "vLLM plugin: while no draft pass runs, hold the drafter's context K/V writes and do "
           "them in one batched call"),
    Switch("DFLASH_SAMPLER_SHORTCUT", "on/off", "on",
           "vLLM plugin: steps that verify no drafts skip vLLM's rejection sampler"),
    Switch("DFLASH_NGRAM_DRAFTS", "on/off", "on",
           "vLLM plugin (V1 runner): where prompt lookup (an n-gram of the request's own tokens) "
           "is expected to draft better than the drafter, verify its tokens instead, per request"),
    Switch("DFLASH_DATASTORE", "text", None,
           "vLLM plugin (V1 runner, with DFLASH_NGRAM_DRAFTS): the target's answer files "
           "(comma-separated .jsonl / .jsonl.gz, or one saved .npz) whose continuation of a "
           "request's last n-gram is drafted where it is expected to beat the drafter and lookup"),
    Switch("DFLASH_STATS_EVERY", "count", "2000",
           "vLLM plugin: log what the draft policy did every N steps; 0 never"),
    Switch("DFLASH_ARENA_CACHE", "on/off", "on",
           "vLLM plugin on CPU: CPython's arena blocks (frame-stack chunks, object arenas) from "
           "malloc, which reuses them, instead of a fresh mmap / munmap per block"),
    Switch("DFLASH_VLLM_SKIP_VERSION_CHECK", "on/off", "off",
           "vLLM plugin: load on a vLLM release outside the tested series (untested)"),
    Switch("DFLASH_CPU_PRELOAD", "on/off", "on",
           "`dflash serve` / `dflash bench`: start vLLM-CPU servers with tcmalloc and Intel "
           "OpenMP in LD_PRELOAD"),
    Switch("DFLASH_CPU_CORES", "choice", "auto",
           "`dflash serve` / `dflash bench`: the vLLM-CPU engine leaves one core to the front end "
           "as vLLM does (reserve-one), or computes on every core, the front end sharing them "
           "(all); auto: all on machines of up to 2 cores (measured faster there), else reserve-one",
           ("auto", "reserve-one", "all")),
    Switch("DFLASH_SGLANG_PLUGIN", "on/off", "on",
           "SGLang: off keeps the package installed but registers nothing (SGLang's own DFlash "
           "drafter stays)"),
    Switch("DFLASH_SGLANG_DRAFTER", "choice", "native",
           "SGLang: which drafter serves DFlash checkpoints: SGLang's own (native) or this "
           "adapter's where it can (plugin)", ("native", "plugin")),
    Switch("DFLASH_SGLANG_ALLOW_UNTESTED", "on/off", "off",
           "SGLang: run on a release outside the tested one, with a warning instead of a refusal"),
    Switch("DFLASH_SGLANG_VENV", "path", None,
           "The SGLang environment `dflash serve --engine sglang` runs and the setup script "
           "creates (unset: `.venv-sglang` in the project folder)"),
    Switch("DFLASH_SGLANG_FULL", "flag", None,
           "Setup script: install SGLang with all its dependencies (as on a GPU host)"),
    Switch("DFLASH_SGLANG_BASE_PYTHON", "text", "python3.11",
           "Setup script: the interpreter the SGLang environment is created from"),
    Switch("DFLASH_SKIP_DISK_CHECK", "flag", None,
           "Setup: install even when the disk looks too small"),
    Switch("DFLASH_HOME", "path", "~/.cache/dflash-plugin",
           "Where the converted default target and other downloads are kept"),
    Switch("DFLASH_SOURCES", "path", "$DFLASH_HOME/sources",
           "Training: where the pinned source packages of the prompt texts are unpacked"),
)
BY_NAME = {switch.name: switch for switch in SWITCHES}


def _switch(name: str) -> Switch:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in dflash_plugin.switches") from None


def is_set(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment sets `name` at all (even to an empty value)."""
    return _switch(name).name in environ


def read(name: str, environ: Mapping[str, str] = os.environ):
    """The value of the declared variable `name` in `environ`, or its default: a bool (on/off),
    the chosen value (choice), an int (count), a str (text; None when unset without default)
    or a Path (path; None when unset without default). Bad values raise SwitchError."""
    switch = _switch(name)
    raw = environ.get(name)
    if raw is None or not raw.strip():  # set but empty counts as unset
        raw = switch.default
    if raw is None:
        return None
    value = raw.strip()
    if switch.kind == "on/off":
        if value.lower() in ON:
            return True
        if value.lower() in OFF:
            return False
        raise SwitchError(f"{name}={value!r}: expected on or off")
    if switch.kind == "choice":
        if value.lower() in switch.choices:
            return value.lower()
        raise SwitchError(f"{name}={value!r}: expected one of {', '.join(switch.choices)}")
    if switch.kind == "count":
        if value.isdigit():
            return int(value)
        raise SwitchError(f"{name}={value!r}: expected a whole number >= 0")
    if switch.kind == "path":
        expanded = re.sub(r"\$(DFLASH_[A-Z0-9_]+)", lambda m: str(read(m[1], environ)), value)
        return Path(expanded).expanduser()
    if switch.kind == "flag":
        return bool(value)
    return value


def markdown_table() -> str:
    """The README's "Environment switches" table."""
    rows = ["| variable | values | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.values} | {s.shown_default} | {s.meaning} |" for s in SWITCHES]
    return "\n".join(rows)
