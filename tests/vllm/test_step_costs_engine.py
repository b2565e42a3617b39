"""Step costs measured while serving (dflash_plugin.step_clock through the propose hook P1) in a
real vLLM engine on the SmolLM2 target: with a short refit interval the draft policy's costs
move off the preset to the measured ones, and greedy output stays identical to plain decoding.
"""

from __future__ import annotations

import pytest
from engine_helpers import engine, environment, shipped_drafter

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, seed=0, max_num_seqs=8,
                   kv_cache_memory_bytes=1 << 30, enforce_eager=True)
MAX_TOKENS = 32
K = 7
PROMPTS = ["Explain briefly the moon.", "Write a haiku about rain.", "What is a compiler?",
           "List three facts about volcanoes."]
REFIT_EVERY = 8  # decoding steps between refits, instead of StepClock's 256


# Callables sent to the worker (collective_rpc), defined in functions so cloudpickle ships them
# by value: the worker cannot import this test module.
def worker_calls():
    def refit_often(worker, every):
        clock = worker.model_runner.drafter.model.dflash_drafting.clock
        clock.refit_every, clock.min_samples = every, 2

    def clock_state(worker):
        from dataclasses import asdict

        drafting = worker.model_runner.drafter.model.dflash_drafting
        clock = drafting.clock
        last = drafting.measured
        return dict(steps=clock.steps, draft_passes=clock.draft_passes,
                    preset=asdict(clock.preset), costs=asdict(drafting.policy.costs),
                    last_refit=None if last is None else dict(
                        costs=asdict(last.costs), verify=last.verify, draft=last.draft))

    return refit_often, clock_state


def answers(llm, prompt_sets):
    """Greedy answers (token ids) of each prompt set, one call per set."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [[list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
            for prompts in prompt_sets]


@pytest.fixture(scope="module")
def runs(target_path, plain_llm):
    drafter = shipped_drafter()
    if drafter is None:
        pytest.skip("needs the shipped drafter")
    prompt_sets = [[p] for p in PROMPTS] + [PROMPTS]  # batch 1, then a batch: several N and B
    plain = answers(plain_llm, prompt_sets)
    refit_often, clock_state = worker_calls()
    with environment(DFLASH_DRAFT_POLICY="adaptive", DFLASH_STATS_EVERY="0",
                     VLLM_ALLOW_INSECURE_SERIALIZATION="1"), \
            engine(target_path, drafter, num_speculative_tokens=K, **ENGINE_ARGS) as llm:
        llm.collective_rpc(refit_often, args=(REFIT_EVERY,))
        measured = answers(llm, prompt_sets)
        state = llm.collective_rpc(clock_state)[0]
    return dict(plain=plain, measured=measured, state=state)


def test_measured_costs_keep_greedy_output_identical(runs):
    assert runs["measured"] == runs["plain"]


def test_the_policy_runs_on_measured_costs(runs):
    state = runs["state"]
    assert state["steps"] >= REFIT_EVERY, state
    assert state["last_refit"] is not None, state
    assert state["costs"] == state["last_refit"]["costs"] != state["preset"], state
    if state["last_refit"]["verify"] == "measured":  # the unit: this machine's plain step
        assert state["costs"]["verify_fixed"] + state["costs"]["verify_per_token"] == \
            pytest.approx(1.0), state
