"""Linux man pages, sections 4, 5 and 7: devices, file formats and concepts such as sockets,
signals and regular expressions (Debian manpages)."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo
from dflash_plugin.train.sources.man import materials_for

INFO = SourceInfo("manpages", "manpages",
                  "per page: Linux-man-pages-copyleft, GPL-2+, BSD or MIT")


def materials(root: Path, rng: random.Random) -> list[Material]:
    return materials_for(root, ("4", "5", "7"), key="man", domain="Linux", lang="c",
                         topic_kind="man_topic")
