"""`dflash serve --engine sglang`: its flags as an SGLang server command line.

Pure translation; nothing here imports SGLang, so `dflash serve` can build (and print) the command
in the main environment, while the server runs in the SGLang one (.venv-sglang, see
scripts/setup_sglang_env.sh).

The flags of `dflash serve` are SGLang's own server arguments (same names, same meaning:
`--speculative-num-draft-tokens` counts the block's anchor token too), so the translation is
mostly spelling: `speculative_num_draft_tokens=16` becomes `--speculative-num-draft-tokens 16`.
What changes: vLLM-style backend names (FLASHINFER, FLASH_ATTN) become SGLang's, DFLASH without a
drafter is refused here rather than after the model loaded, and NONE drops speculation.

The command runs `python -m sglang_ext.launch_server`, which checks the SGLang version, makes sure
this plugin is loaded, and then runs `sglang.launch_server` unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dflash_plugin.errors import DFlashError
from dflash_plugin.switches import is_set, read
from sglang_ext.versions import installed_sglang_version

# The SGLang environment unless DFLASH_SGLANG_VENV names one (as the setup script does).
DEFAULT_VENV = Path(__file__).resolve().parent.parent / ".venv-sglang"
LAUNCH_MODULE = "sglang_ext.launch_server"

ALGORITHMS = ("DFLASH", "NGRAM", "NONE")
# vLLM's attention-backend names (used in shared configs) -> SGLang's.
BACKEND_ALIASES = {"flash_attn": "fa3", "triton_attn": "triton", "torch_sdpa": "torch_native"}

VALUE_FLAGS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_num_draft_tokens", "speculative_draft_attention_backend", "host", "port", "dtype",
    "context_length", "mem_fraction_static", "tp_size", "attention_backend", "served_model_name",
)
SWITCH_FLAGS = ("trust_remote_code",)
KNOWN_FLAGS = VALUE_FLAGS + SWITCH_FLAGS


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _backend(name: str) -> str:
    name = str(name).lower()
    return BACKEND_ALIASES.get(name, name)


def _normalize(flags: dict) -> dict:
    """Keys in python spelling, unset values (None, False) dropped, unknown keys refused."""
    out = {}
    for key, value in flags.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in KNOWN_FLAGS:
            raise DFlashError(f"dflash serve --engine sglang: unknown flag {_option(name)}; "
                              f"known: {', '.join(_option(k) for k in KNOWN_FLAGS)}. Pass other "
                              "SGLang server arguments after `--`")
        if value is None or value is False:
            continue
        out[name] = value
    return out


def _check_speculation(flags: dict) -> None:
    algorithm = str(flags.get("speculative_algorithm", "NONE")).upper()
    if algorithm not in ALGORITHMS:
        raise DFlashError(f"--speculative-algorithm {flags['speculative_algorithm']!r}: choose "
                          f"from {', '.join(ALGORITHMS)}")
    if algorithm == "NONE":
        for name in ("speculative_algorithm", "speculative_draft_model_path",
                     "speculative_num_draft_tokens", "speculative_draft_attention_backend"):
            flags.pop(name, None)
        return
    flags["speculative_algorithm"] = algorithm
    if algorithm == "DFLASH" and "speculative_draft_model_path" not in flags:
        raise DFlashError("--speculative-algorithm DFLASH needs --speculative-draft-model-path "
                          "(a DFlash drafter folder or Hub id)")
    tokens = flags.get("speculative_num_draft_tokens")
    if tokens is not None and (isinstance(tokens, bool) or int(tokens) < 2):
        raise DFlashError(f"--speculative-num-draft-tokens must be >= 2 (the block includes its "
                          f"anchor token), got {tokens!r}")


def sglang_server_args(flags: dict, passthrough: list[str] = ()) -> list[str]:
    """SGLang server arguments for `dflash serve` flags (python or dashed spelling; None and
    False mean unset). `passthrough` (SGLang's own arguments) comes last, so it wins."""
    flags = _normalize(flags)
    if "model_path" not in flags:
        raise DFlashError("dflash serve --engine sglang needs --model-path (the target model)")
    _check_speculation(flags)
    args = []
    for name in VALUE_FLAGS:
        if name not in flags:
            continue
        value = flags[name]
        if name.endswith("attention_backend"):
            value = _backend(value)
        args += [_option(name), str(value)]
    args += [_option(name) for name in SWITCH_FLAGS if flags.get(name) is True]
    return args + [str(a) for a in passthrough]


def sglang_venv() -> Path:
    return read("DFLASH_SGLANG_VENV") or DEFAULT_VENV


def find_sglang_python() -> str:
    """The interpreter of the SGLang environment ($DFLASH_SGLANG_VENV, default .venv-sglang next
    to this package), else this interpreter if it has SGLang."""
    venv_python = sglang_venv() / "bin" / "python"
    if venv_python.is_file():
        return str(venv_python)
    if not is_set("DFLASH_SGLANG_VENV") and installed_sglang_version() is not None:
        return sys.executable
    raise DFlashError(f"no SGLang environment: {venv_python} does not exist. Run "
                      "scripts/setup_sglang_env.sh (about 6 GB), or set "
                      "DFLASH_SGLANG_VENV to a virtual environment with sglang and dflash-plugin")


def build_launch_command(flags: dict, passthrough: list[str] = (), *,
                         python: str | None = None) -> list[str]:
    """argv that starts SGLang's OpenAI-compatible server with this project's DFlash drafter."""
    args = sglang_server_args(flags, passthrough)
    return [python or find_sglang_python(), "-m", LAUNCH_MODULE, *args]


def launch(flags: dict, passthrough: list[str] = (), *, python: str | None = None,
           env: dict[str, str] | None = None, stdout=None) -> int:
    """Run the server in the foreground until it exits; returns its exit code. Ctrl-C stops it
    (SIGTERM, then SIGKILL after 30 s)."""
    argv = build_launch_command(flags, passthrough, python=python)
    process = subprocess.Popen(argv, env=env, stdout=stdout,
                               stderr=None if stdout is None else subprocess.STDOUT)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
