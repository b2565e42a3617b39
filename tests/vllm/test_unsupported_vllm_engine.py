"""With this package installed, a vLLM outside the supported range keeps working: the plugin
(loaded by vLLM in every process, without a try) warns and stays out, and a plain engine of
the embedded target answers. The out-of-range version comes from a test-only sitecustomize shim
on the engine subprocess's PYTHONPATH (tests/vllm/out_of_range_vllm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

SHIM = Path(__file__).parent / "out_of_range_vllm"
FAKE_VERSION = "0.35.0"
MAX_TOKENS = 12

SCRIPT = """
import json, sys
import vllm
from vllm import LLM, SamplingParams
from vllm.plugins import load_general_plugins

load_general_plugins()  # what every vLLM process does; must neither raise nor register
from vllm_ext import plugin
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True,
          kv_cache_memory_bytes=1 << 28, seed=0)
out = llm.generate(["What is the capital of France?"],
                   SamplingParams(temperature=0.0, max_tokens=%d, ignore_eos=True),
                   use_tqdm=False)[0].outputs[0]
print("RESULT " + json.dumps({"version": vllm.__version__, "registered": plugin._registered,
                              "declined": plugin._declined, "tokens": list(out.token_ids),
                              "text": out.text}), flush=True)
llm.llm_engine.engine_core.shutdown()
""" % MAX_TOKENS


def test_plain_engine_runs_beside_the_plugin_on_an_unsupported_vllm(target_path):
    env = dict(os.environ, FAKE_VLLM_VERSION=FAKE_VERSION, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])))
    env.pop("VLLM_PLUGINS", None)  # every installed plugin loads, this one included
    env.pop("DFLASH_VLLM_SKIP_VERSION_CHECK", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(target_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    (line,) = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["version"] == FAKE_VERSION
    assert not result["registered"] and result["declined"]
    assert len(result["tokens"]) == MAX_TOKENS and result["text"].strip()
    assert f"but vLLM {FAKE_VERSION} is installed; it is not loaded" in log
    assert "dflash plugin: patched" not in log
