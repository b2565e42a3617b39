"""Helpers for tests against real `dflash serve` servers on the embedded default target.

Servers take a minute or more to start on a 2-core machine, so each configuration starts once per
module, one at a time, in eager mode (`-- --enforce-eager`: no compile step, and no compile-cache
entry per random drafter), on a free port of 127.0.0.1, and is always stopped in teardown.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

from dflash_cli.serving.bench import parse_counters
from dflash_cli.serving.flags import Launch
from dflash_cli.serving.server import Server, ServerExited, free_port

HAVE_SERVER_DEPS = all(importlib.util.find_spec(m) for m in ("vllm", "openai"))
START_TIMEOUT = float(os.environ.get("DFLASH_TEST_SERVER_TIMEOUT", "900"))
MODEL = "SmolLM2-135M-Instruct"  # served name of the embedded default
RANDOM_DRAFTER_LAYER_IDS = [1, 8, 14, 20, 27]
T = TypeVar("T")


def make_random_drafter(path: Path, target_path: Path, **overrides) -> Path:
    """A randomly initialized 2-layer DFlash drafter for the embedded target (acceptance ~0)."""
    import torch
    from transformers import AutoConfig

    from dflash_plugin.checkpoint import save_drafter
    from dflash_plugin.config import make_config
    from dflash_plugin.drafter import DFlashDraftModel

    target_config = AutoConfig.from_pretrained(str(target_path))
    for key, value in overrides.pop("target_overrides", {}).items():
        setattr(target_config, key, value)
    settings = dict(num_draft_layers=2, block_size=16, mask_token_id=3,
                    target_layer_ids=RANDOM_DRAFTER_LAYER_IDS)
    settings.update(overrides)
    torch.manual_seed(0)
    save_drafter(DFlashDraftModel(make_config(target_config, **settings)), path)
    return path


class ServeProcess(Server):
    """`python -m dflash_cli.main serve ...` on a free port, output in a log file."""

    def __init__(self, log_path: Path, *serve_args: str, env: dict[str, str] | None = None):
        port = free_port()
        argv = [sys.executable, "-m", "dflash_cli.main", "serve", "--port", str(port), *serve_args]
        super().__init__(Launch(argv, {}, dict(env or {}), "127.0.0.1", port, MODEL),
                         log_path=log_path)

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""


def start_server(log_path: Path, *serve_args: str,
                 env: dict[str, str] | None = None) -> ServeProcess:
    server = ServeProcess(log_path, *serve_args, env=env).start()
    try:
        seconds = server.wait_ready(START_TIMEOUT)
    except (ServerExited, TimeoutError) as err:
        server.stop()
        pytest.fail(f"server did not start: {err}\n--- log tail ---\n{server.output_tail()}")
    print(f"[server] {log_path.name} ready after {seconds:.0f} s")
    return server


# float32 with a 1024-token context, in eager mode: `dflash serve` options, then vLLM's own.
FP32_CONTEXT = 1024
FP32_EAGER = ["--dtype", "float32", "--context-length", str(FP32_CONTEXT), "--", "--enforce-eager"]
# Draft passes priced at nothing and verified drafts cheap: the load-aware policy drafts every
# step and verifies, per request, as many drafts as their confidence is worth.
CHEAP_DRAFTS = ("verify_fixed=1,verify_per_token=0.02,draft_fixed=0,draft_per_request=0,"
                "min_speedup=1,min_speedup_batched=1")


def start_fp32_server(log_path: Path, *serve_args: str,
                      env: dict[str, str] | None = None) -> ServeProcess:
    """start_server with FP32_EAGER after `serve_args`."""
    return start_server(log_path, *serve_args, *FP32_EAGER, env=env)


def plain_fp32_outputs(log_path: Path, collect: Callable[[Server], T]) -> T:
    """collect(server) on a no-speculation FP32_EAGER server, stopped before this returns (the
    reference runs first, and never beside the server it is compared with)."""
    server = start_fp32_server(log_path, "--speculative-algorithm", "NONE")
    try:
        return collect(server)
    finally:
        server.stop()


def cheap_drafts_fp32_server(log_path: Path, drafter: Path,
                             *serve_args: str) -> Iterator[ServeProcess]:
    """For a fixture to `yield from`: a DFlash FP32_EAGER server on `drafter` under the
    CHEAP_DRAFTS cost model, stopped at teardown."""
    server = start_fp32_server(log_path, "--speculative-draft-model-path", str(drafter),
                               *serve_args, env={"DFLASH_COST_MODEL": CHEAP_DRAFTS})
    try:
        yield server
    finally:
        server.stop()


def scrape(server) -> dict[str, float]:
    """The server's Prometheus counters (/metrics)."""
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
        return parse_counters(response.read().decode())


def openai_client(server: Server, **kwargs):
    from openai import OpenAI
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY", max_retries=0,
                  timeout=kwargs.pop("timeout", 300), **kwargs)


def async_openai_client(server: Server):
    from openai import AsyncOpenAI
    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY", max_retries=0, timeout=300)


def token_ids(choice) -> list[int]:
    """Output token ids of a choice (vLLM's `return_token_ids` extension)."""
    ids = (choice.model_extra or {}).get("token_ids")
    assert ids is not None, "server did not return token_ids"
    return list(ids)


PROMPTS = [
    "Write a short, friendly email inviting a colleague to a team lunch on Friday.",
    "Explain what a hash table is to a beginner programmer, with a simple example.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What is 17 multiplied by 23? Show your working step by step.",
    "Give three tips for staying focused while studying at home.",
    "Summarize the water cycle in four sentences.",
    "Write a haiku about autumn leaves.",
    "List five countries in South America and their capital cities.",
    "Why is the sky blue? Answer in simple terms.",
    "Translate into French: 'The library opens at eight in the morning.'",
    "You are a tour guide in Rome. Welcome a group of tourists.",
    "What is the difference between a list and a tuple in Python?",
    "Solve for x: 3x + 7 = 25.",
    "Explain photosynthesis in three sentences.",
    "Write a limerick about a cat who loves to code.",
    "Count from one to twenty in words, separated by commas.",
]
MAX_TOKENS = 40


def chat_ids(client, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, extra_body={"return_token_ids": True})
    return token_ids(response.choices[0])


async def _concurrent_chat_ids(server: Server, prompts: list[str]) -> list[list[int]]:
    client = async_openai_client(server)
    try:
        async def one(prompt):
            response = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS, temperature=0, extra_body={"return_token_ids": True})
            return token_ids(response.choices[0])
        return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 600)
    finally:
        await client.close()


def collect_outputs(server: Server, num_sequential: int = 8, num_concurrent: int = 16,
                    completions: bool = True) -> dict:
    """Greedy outputs (token ids) of one server: chat (and completions) one request at a time,
    and chat with `num_concurrent` requests in flight at once."""
    client = openai_client(server)
    prompts = PROMPTS[:num_sequential]
    outputs = {"chat": [chat_ids(client, p) for p in prompts]}
    if completions:
        outputs["completion"] = []
        for prompt in prompts:
            response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                                 temperature=0, extra_body={"return_token_ids": True})
            outputs["completion"].append(token_ids(response.choices[0]))
    outputs["concurrent"] = asyncio.run(_concurrent_chat_ids(server, PROMPTS[:num_concurrent]))
    return outputs


def match_rate(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
