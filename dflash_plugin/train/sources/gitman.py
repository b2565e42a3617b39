"""Git's manual pages (Debian git-man): commands, options and concepts."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.man import materials_for

INFO = SourceInfo("gitman", "git-man", "GPL-2")


def materials(root: Path, rng: random.Random) -> list[Material]:
    return materials_for(root, ("1", "5", "7"), key="git", domain="git", lang="shell",
                         topic_kind="command")
