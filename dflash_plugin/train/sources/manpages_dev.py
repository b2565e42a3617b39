"""Linux system calls and C library functions, sections 2 and 3 (Debian manpages-dev),
including the complete C programs in their EXAMPLES sections."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.man import materials_for

INFO = SourceInfo("manpages-dev", "manpages-dev",
                  "per page: Linux-man-pages-copyleft, GPL-2+, BSD or MIT")


def materials(root: Path, rng: random.Random) -> list[Material]:
    return materials_for(root, ("2", "3"), key="mandev", domain="C", lang="c",
                         topic_kind="c_function")
