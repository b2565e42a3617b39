"""On/off environment switches (DFLASH_*), spelt the same way everywhere: on|1|true, off|0|false."""

from __future__ import annotations

import os
from collections.abc import Mapping


def switch_from_env(name: str, default: str = "on",
                    environ: Mapping[str, str] = os.environ) -> bool:
    """The switch `name` in `environ` (default `default`); anything else is refused."""
    value = environ.get(name, default).strip().lower()
    if value in ("on", "1", "true"):
        return True
    if value in ("off", "0", "false"):
        return False
    raise ValueError(f"{name}={value!r}: expected on or off")
