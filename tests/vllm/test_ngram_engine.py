"""Prompt-lookup drafts (DFLASH_NGRAM_DRAFTS=on) in a real vLLM engine on the SmolLM2 target:
greedy output token-identical to plain decoding, on copy-heavy prompts where lookup drafts are
actually verified, alone and in a batch with ordinary prompts."""

from __future__ import annotations

import pytest
from engine_helpers import engine, environment, shipped_drafter

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, seed=0, max_num_seqs=8,
                   kv_cache_memory_bytes=1 << 30, enforce_eager=True)
MAX_TOKENS = 48
K = 7
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a "
           "tin of oil and a cloth for the lens. Ships passing the rocky point counted on the "
           "beam, and in forty years it had never once gone dark.")
COPY_PROMPTS = [f"Repeat this text exactly, word for word: {PASSAGE}",
                f"Copy the following sentence without changing anything:\n\n{PASSAGE}"]
OTHER_PROMPTS = ["Write a haiku about rain.", "What is a compiler?"]


def run_engine(target, prompt_sets, drafter=None, env=None, worker_call=None):
    """Greedy answers (token ids) of each prompt set, one generate call per set, and the
    result of `worker_call` on the worker afterwards."""
    from vllm import SamplingParams

    with environment(**(env or {})), \
            engine(target, drafter, num_speculative_tokens=K, **ENGINE_ARGS) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        outputs = []
        for prompts in prompt_sets:
            messages = [[{"role": "user", "content": p}] for p in prompts]
            outputs.append([list(o.outputs[0].token_ids) for o in
                            llm.chat(messages, params, use_tqdm=False)])
        worker = llm.collective_rpc(worker_call)[0] if worker_call else None
    return outputs, worker


def lookup_state():
    # Defined in a function so cloudpickle ships it by value to the worker.
    def state(worker):
        drafting = worker.model_runner.drafter.model.dflash_drafting
        ngram = drafting.ngram
        return None if ngram is None else dict(
            lookup_drafts_verified=ngram.calibration.num_drafts_seen,
            drafter_drafts_verified=drafting.policy.calibration.num_drafts_seen)

    return state


@pytest.fixture(scope="module")
def runs(target_path):
    drafter = shipped_drafter()
    if drafter is None:
        pytest.skip("needs the shipped drafter")
    prompt_sets = [[p] for p in COPY_PROMPTS] + [COPY_PROMPTS + OTHER_PROMPTS]
    plain, _ = run_engine(target_path, prompt_sets)
    hybrid, state = run_engine(target_path, prompt_sets, drafter,
                               {"DFLASH_NGRAM_DRAFTS": "on", "DFLASH_STATS_EVERY": "0",
                                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
                               lookup_state())
    return dict(plain=plain, hybrid=hybrid, state=state)


def test_lookup_drafts_keep_greedy_output_identical(runs):
    assert runs["hybrid"] == runs["plain"]


def test_lookup_drafts_were_verified(runs):
    state = runs["state"]
    assert state is not None, "DFLASH_NGRAM_DRAFTS=on built no lookup"
    assert state["lookup_drafts_verified"] > 0
