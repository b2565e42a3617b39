"""End to end on a GPU: `dflash serve --engine sglang`'s command (sglang_ext.server_args) starts
SGLang's OpenAI server with SGLang's own drafter and with this project's; greedy completions
through the openai client are token-identical to the same server without speculation.

The target is the embedded default (SmolLM2-135M-Instruct, built from PyPI on first use), the
drafter the shipped one if present, else a random one: losslessness does not depend on how good
the drafter is. DFLASH_E2E_DTYPE (default bfloat16) sets the dtype of both servers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

import torch  # noqa: E402

pytestmark = [
    pytest.mark.gpu, pytest.mark.sglang, pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: SGLang 0.5.23 runs DFLASH only on cuda/npu/xpu "
                              "(its device gate refuses cpu), so there is no CPU server to test"),
]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three colours of the rainbow are",
           "Once upon a time, in a small village,"]
MAX_TOKENS = 48
READY_TIMEOUT = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drafter_for(target: Path, workdir: Path) -> Path:
    from dflash_plugin.defaults import DRAFTERS_DIR, DEFAULT_DRAFTER_NAME

    shipped = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
    if (shipped / "config.json").is_file():
        return shipped
    from transformers import AutoConfig, AutoTokenizer

    from dflash_plugin.checkpoint import save_drafter
    from dflash_plugin.config import make_config
    from dflash_plugin.drafter import DFlashDraftModel

    tokenizer = AutoTokenizer.from_pretrained(target)
    mask = tokenizer.convert_tokens_to_ids("<repo_name>")  # a special token chats never produce
    torch.manual_seed(0)
    config = make_config(AutoConfig.from_pretrained(target), num_draft_layers=2, block_size=8,
                         mask_token_id=mask)
    save_drafter(DFlashDraftModel(config), workdir / "drafter")
    return workdir / "drafter"


class Server:
    def __init__(self, flags: dict, log: Path, env: dict | None = None):
        from sglang_ext.server_args import build_launch_command

        self.port = free_port()
        self.log = log
        argv = build_launch_command({**flags, "host": "127.0.0.1", "port": self.port},
                                    ["--mem-fraction-static", "0.5"], python=sys.executable)
        self.process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def __enter__(self):
        import urllib.request

        deadline = time.time() + READY_TIMEOUT
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode}):\n"
                                   + self.log.read_text()[-4000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return self
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"server not ready in {READY_TIMEOUT}s:\n"
                           + self.log.read_text()[-4000:])

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def complete(self, model: str) -> list[str]:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="EMPTY")
        return [client.completions.create(model=model, prompt=p, max_tokens=MAX_TOKENS,
                                          temperature=0).choices[0].text for p in PROMPTS]


# SGLang's own drafter (the default) and this adapter's (DFLASH_SGLANG_DRAFTER=plugin).
DRAFTER_LOG_LINES = {"native": "SGLang's own DFlash drafter serves",
                     "plugin": "dflash-plugin drafter"}


@pytest.mark.parametrize("drafter_choice", sorted(DRAFTER_LOG_LINES))
def test_dflash_on_sglang_is_token_identical_to_no_speculation(tmp_path, drafter_choice):
    from transformers import AutoTokenizer

    from dflash_plugin.target import ensure_default_target

    target = ensure_default_target()
    drafter = drafter_for(target, tmp_path)
    dtype = os.environ.get("DFLASH_E2E_DTYPE", "bfloat16")
    base = {"model_path": str(target), "dtype": dtype, "served_model_name": "target"}

    with Server({**base, "speculative_algorithm": "NONE"}, tmp_path / "plain.log") as server:
        plain = server.complete("target")
    with Server({**base, "speculative_algorithm": "DFLASH",
                 "speculative_draft_model_path": str(drafter)}, tmp_path / "dflash.log",
                env={"DFLASH_SGLANG_DRAFTER": drafter_choice}) as server:
        speculative = server.complete("target")

    log = (tmp_path / "dflash.log").read_text()
    assert DRAFTER_LOG_LINES[drafter_choice] in log, f"not the {drafter_choice} drafter"
    tokenizer = AutoTokenizer.from_pretrained(target)
    for prompt, a, b in zip(PROMPTS, plain, speculative):
        ids_a, ids_b = tokenizer(a).input_ids, tokenizer(b).input_ids
        assert ids_a == ids_b, f"{prompt!r}: without speculation {a!r}, with DFLASH {b!r}"
