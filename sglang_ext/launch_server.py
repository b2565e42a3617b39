"""`python -m sglang_ext.launch_server ARGS`: SGLang's `python -m sglang.launch_server ARGS`, after
checking that this SGLang is supported and that the dflash plugin is loaded (so a refusal stops
the server with a clear message instead of SGLang's default drafter silently taking over).
`dflash serve --engine sglang` runs this in .venv-sglang (sglang_ext.server_args)."""

from __future__ import annotations

import os
import runpy
import sys

from dflash_plugin.errors import DFlashError
from sglang_ext.plugin import PLUGIN_NAME


def allow_plugin(environ) -> None:
    """If SGLANG_PLUGINS restricts SGLang's plugins, add ours (child processes inherit it)."""
    allowed = [n.strip() for n in environ.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if allowed and PLUGIN_NAME not in allowed:
        environ["SGLANG_PLUGINS"] = ",".join([*allowed, PLUGIN_NAME])


def main(argv: list[str]) -> int:
    from sglang_ext import plugin

    try:
        if plugin.enabled():
            plugin.register()
            allow_plugin(os.environ)
    except DFlashError as err:
        print(f"dflash: error: {err}", file=sys.stderr)
        return 2
    sys.argv = ["sglang.launch_server", *argv]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
