"""Debian packages as text sources: downloaded (never installed) and unpacked into a cache.

`apt-get download` needs no root and pulls in no dependencies; `dpkg-deb -x` unpacks the files
into $DFLASH_HOME/sources/PACKAGE. The version is recorded next to the files so the data card
can name exactly what a prompt set was built from.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dflash_plugin.errors import DFlashError
from dflash_plugin.switches import read

_MARKER = ".dflash-package.json"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    root: Path  # the unpacked file system tree (root / "usr/share/...")


def source_cache() -> Path:
    return read("DFLASH_SOURCES")  # default $DFLASH_HOME/sources


def cached_package(name: str, cache: Path | None = None) -> Package | None:
    """The unpacked package if it is in the cache, else None (never downloads)."""
    root = (cache or source_cache()) / name
    marker = root / _MARKER
    if not marker.is_file():
        return None
    meta = json.loads(marker.read_text())
    return Package(meta["package"], meta["version"], root)


def _run(cmd: list[str], cwd: Path) -> str:
    if shutil.which(cmd[0]) is None:
        raise DFlashError(f"{cmd[0]} is not installed: fetching Debian text sources needs "
                          "apt-get and dpkg-deb (a Debian or Ubuntu machine)")
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise DFlashError(f"{' '.join(cmd)} failed: {result.stderr.strip()[-400:]}")
    return result.stdout


def fetch_package(name: str, cache: Path | None = None) -> Package:
    """The package from the cache, downloading and unpacking it first if it is not there."""
    found = cached_package(name, cache)
    if found is not None:
        return found
    cache = cache or source_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{name}.") as tmp:
        tmp = Path(tmp)
        debs = sorted(tmp.glob("*.deb"))
        if not debs:
            _run(["apt-get", "download", name], tmp)
            debs = sorted(tmp.glob("*.deb"))
        if not debs:
            raise DFlashError(f"apt-get download {name} left no .deb file")
        version = _run(["dpkg-deb", "-f", str(debs[0]), "Version"], tmp).strip()
        tree = tmp / "tree"
        _run(["dpkg-deb", "-x", str(debs[0]), str(tree)], tmp)
        (tree / _MARKER).write_text(json.dumps({"package": name, "version": version}))
        target = cache / name
        if target.exists():
            shutil.rmtree(target)
        tree.rename(target)  # complete trees only: an interrupted fetch leaves no marker
    return Package(name, version, target)


def unpack_deb(deb: Path, cache: Path | None = None) -> Package:
    """Unpack an already downloaded .deb into the cache (machines with the .deb but no apt)."""
    name = _run(["dpkg-deb", "-f", str(deb), "Package"], deb.parent).strip()
    cache = cache or source_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{name}.") as tmp:
        shutil.copy(deb, Path(tmp) / deb.name)
        staged = Path(tmp)
        version = _run(["dpkg-deb", "-f", str(staged / deb.name), "Version"], staged).strip()
        tree = staged / "tree"
        _run(["dpkg-deb", "-x", str(staged / deb.name), str(tree)], staged)
        (tree / _MARKER).write_text(json.dumps({"package": name, "version": version}))
        target = cache / name
        if target.exists():
            shutil.rmtree(target)
        tree.rename(target)
    return Package(name, version, target)
