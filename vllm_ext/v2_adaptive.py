"""Load-aware drafting on vLLM's Model Runner V2, through vLLM's own adaptive verification.

On V2 the DFlash speculator drafts a full block for every request every step, and with async
scheduling (vLLM's default on GPUs) each request's draft count is fixed before its drafts exist,
so the V1 propose hook (P1, vllm_ext.patches) has nothing to act on. vLLM's adaptive verification
(`enable_adaptive_verification` in the speculative config) trims instead how many of the
scheduled drafts the target verifies: each step the runner picks a draft budget on the CPU from
the previous draft pass's per-position acceptance estimates and its profiled step costs, then
admits, on the GPU, the drafts with the highest chance of surviving. For DFlash those estimates
come from the drafter: vLLM's speculator feeds the drafter's logits (this plugin's
`compute_logits`) to its online acceptance estimator, a logistic fit of each position's top-1
confidence that is refitted on the GPU from what verification accepted.

This module adds to that budget what vLLM's choice lacks, from dflash_plugin.draft_policy:
- the speedup bar (`CostModel.min_speedup` / `min_speedup_batched`): drafts are verified only
  when the expected rate beats verifying none by that factor, as on V1; vLLM takes any gain;
- the policy modes: `full` verifies every scheduled draft, `off` none;
- the plugin's step prices, when DFLASH_COST_MODEL names any of them; otherwise vLLM's
  profiled tables price the step (measured on the GPU that runs, unlike the CUDA preset).
The draft pass itself always runs on V2 (vLLM's design): only verification is trimmed.

P3, the patch on AdaptiveVerificationManager.get_num_tokens (its target, guards and tests are in
docs/engine-ledger.md), wraps the original and lets it run (its bookkeeping, `_batch_budget`, is
what compact_batch and reallocate_drafts read next), then chooses the budget again from the same
inputs (the previous draft pass's confidences already copied to the CPU, each request's scheduled
drafts, the non-draft tokens, vLLM's cost tables or the plugin's prices) and stores it in
`_batch_budget`. Only the count changes: which drafts fill it is still vLLM's choice, and every
verified draft goes through the rejection sampler, so the output is unchanged (token-identical at
T=0). It is numpy on arrays vLLM has already copied to the CPU: no GPU sync, so async scheduling is
unaffected. It acts only in a worker whose runner built this plugin's drafter for method dflash
(vllm_ext.load_aware activates it); elsewhere it returns the original's answer untouched.
It can go when vLLM's adaptive verification takes a speedup margin or a budget hook.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

import numpy as np

from dflash_plugin.draft_policy import CostModel, PolicyMode

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

# The manager methods P3 overrides or whose input it rewrites, as written against (vLLM 0.32).
EXPECTED_PARAMS = {
    "get_num_tokens": ("self", "num_tokens_per_req", "draft_tokens"),
    "compact_batch": ("self", "num_draft_tokens_per_req", "num_scheduled_tokens",
                      "cu_num_logits_np"),
    "reallocate_drafts": ("self", "req_ids", "idx_mapping"),
    "record_confidences": ("self", "confidence_probs", "input_batch"),
}
# CostModel fields that price a step (the others are the speedup bar).
PRICE_FIELDS = ("verify_fixed", "verify_per_token", "draft_fixed", "draft_per_request")


def names_prices(cost_model_text: str) -> bool:
    """Whether a DFLASH_COST_MODEL text ("name=value,...") sets any step price."""
    names = {item.partition("=")[0].strip() for item in cost_model_text.split(",")}
    return any(name in names for name in PRICE_FIELDS)


@dataclass(frozen=True)
class BatchDrafts:
    """One step's inputs to the budget, as vLLM holds them when it chooses its own."""

    confidences: np.ndarray  # [R, K] per-position acceptance estimates of the last draft pass
    scheduled: np.ndarray  # [R] drafts the scheduler reserved for each request
    other_tokens: int  # target tokens of the step that are not drafts
    sampling_requests: int  # requests that emit a token this step
    max_budget: int  # most drafts one step may verify (vLLM's logits chunk)

    @property
    def num_requests(self) -> int:
        return int(self.scheduled.shape[0])


def survival_scores(confidences: np.ndarray, scheduled: np.ndarray) -> np.ndarray:
    """Each scheduled draft's chance that it and every draft before it are accepted, best
    first (the order in which vLLM admits drafts)."""
    survival = np.cumprod(np.clip(confidences, 0.0, 1.0).astype(np.float64), axis=1)
    steps = np.arange(confidences.shape[1])
    return np.sort(survival[steps[None, :] < scheduled[:, None]])[::-1]


def best_budget(scores: np.ndarray, sampling_requests: int, step_costs: np.ndarray,
                bar: float) -> int:
    """How many of the best `scores` to verify: the count maximising expected tokens per unit
    of `step_costs` ([len(scores) + 1], the step's cost verifying 0, 1, ... drafts), or 0 when
    that rate does not beat verifying none by `bar`. Ties go to fewer drafts."""
    expected = sampling_requests + np.concatenate(([0.0], np.cumsum(scores)))
    rates = expected / np.maximum(step_costs, 1e-12)  # user prices may make a step free
    best = int(np.argmax(rates))
    if best and rates[best] < rates[0] * bar:
        return 0
    return best


@dataclass
class BudgetCounts:
    """What the budget did over a window of steps (logged, then reset; read by tests)."""

    steps: int = 0
    drafts_scheduled: int = 0
    drafts_verified: int = 0  # the budgets handed to vLLM
    vllm_verified: int = 0  # what vLLM's own choice would have verified

    def summary(self) -> str:
        return (f"{self.steps} steps: {self.drafts_scheduled} drafts scheduled, "
                f"{self.drafts_verified} verified ({self.vllm_verified} by vLLM's own budget)")


@dataclass
class VerifyBudget:
    """The policy's draft budget for one V2 worker.

    costs: the plugin's cost model; its speedup bar always applies, its prices only with
    `plugin_prices` (otherwise vLLM's profiled cost tables price each step).
    """

    mode: PolicyMode
    costs: CostModel
    plugin_prices: bool = False
    stats_every: int = 0  # log the counts every this many steps (0: never)
    counts: BudgetCounts = field(default_factory=BudgetCounts)

    def choose(self, batch: BatchDrafts,
               cost_tables: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """The number of drafts to verify this step (0 .. batch.max_budget)."""
        if self.mode is PolicyMode.OFF or batch.max_budget <= 0:
            return 0
        if self.mode is PolicyMode.FULL:
            return batch.max_budget
        scores = survival_scores(batch.confidences, batch.scheduled)[:batch.max_budget]
        tokens = batch.other_tokens + np.arange(scores.shape[0] + 1)
        if self.plugin_prices or cost_tables is None:
            step_costs = (self.costs.draft_time(batch.num_requests)
                          + self.costs.verify_time(tokens.astype(np.float64)))
        else:
            draft_ms, verify_ms = cost_tables
            step_costs = (draft_ms[min(batch.num_requests, len(draft_ms) - 1)]
                          + verify_ms[np.minimum(tokens, len(verify_ms) - 1)])
        return best_budget(scores, batch.sampling_requests, step_costs,
                           self.costs.speedup_bar(batch.num_requests))

    def record(self, batch: BatchDrafts, chosen: int, vllm_chosen: int):
        counts = self.counts
        counts.steps += 1
        counts.drafts_scheduled += int(batch.scheduled.sum())
        counts.drafts_verified += chosen
        counts.vllm_verified += vllm_chosen
        if self.stats_every and counts.steps >= self.stats_every:
            logger.info("dflash plugin: verification budget over %s", counts.summary())
            self.counts = BudgetCounts()

    def describe(self) -> str:
        if self.mode is PolicyMode.OFF:
            return "policy off: no draft verified, the draft pass still runs"
        if self.mode is PolicyMode.FULL:
            return "policy full: every scheduled draft verified"
        alone, batched = self.costs.min_speedup, self.costs.min_speedup_batched
        bar = (f"{alone:g}" if alone == batched
               else f"{alone:g} for one request, {batched:g} for more")
        prices = (f"the plugin's prices {self.priced()}" if self.plugin_prices
                  else "vLLM's profiled step costs")
        return f"policy adaptive, {prices}, speedup bar {bar}"

    def priced(self) -> str:
        return ", ".join(f"{f.name}={getattr(self.costs, f.name):g}" for f in fields(CostModel)
                         if f.name in PRICE_FIELDS)


# The budget of this worker process (its runner has one speculator): None, P3 returns vLLM's.
_active: VerifyBudget | None = None


def activate(budget: VerifyBudget | None):
    global _active
    _active = budget


def active_budget() -> VerifyBudget | None:
    return _active


def batch_drafts(manager, num_tokens_per_req: dict[str, int],
                 draft_tokens: dict[str, list[int]]) -> BatchDrafts:
    """The budget's inputs, read from vLLM's manager as its get_num_tokens reads them."""
    req_ids = list(num_tokens_per_req)
    num_reqs = len(req_ids)
    scheduled = np.fromiter((len(draft_tokens.get(req_id, ())) for req_id in req_ids),
                            dtype=np.int64, count=num_reqs)
    tokens = np.fromiter(num_tokens_per_req.values(), dtype=np.int64, count=num_reqs)
    other = tokens - scheduled
    states = manager.req_states
    slots = np.fromiter(map(states.req_id_to_index.__getitem__, req_ids), dtype=np.int64,
                        count=num_reqs)
    confidences = manager._stale_confidences[manager._stale_idx].np[slots]  # A5
    sampling = np.count_nonzero(states.num_computed_tokens_np[slots] + other
                                >= states.prefill_len.np[slots])
    logits_room = manager._max_total_logits - num_reqs * manager.num_bonus_tokens  # A5
    return BatchDrafts(confidences=confidences, scheduled=scheduled,
                       other_tokens=int(other.sum()), sampling_requests=int(sampling),
                       max_budget=min(int(scheduled.sum()), max(0, logits_room)))


def _step_aside(error: Exception):
    activate(None)
    logger.warning("dflash plugin: vLLM's adaptive verification no longer looks as the "
                   "verification budget hook expects (%s: %s); vLLM's own budget is used from "
                   "now on", type(error).__name__, error)


def _budgeted_get_num_tokens(original):
    """P3's replacement for AdaptiveVerificationManager.get_num_tokens, around `original`."""

    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        num_tokens = original(self, num_tokens_per_req, draft_tokens)
        budget = _active
        if budget is None:
            return num_tokens
        try:
            drafts_per_req, other_per_req, vllm_budget = self._batch_budget  # A5
            other = sum(other_per_req.values())
            if other + vllm_budget != num_tokens:
                raise ValueError(f"_batch_budget adds up to {other + vllm_budget}, "
                                 f"get_num_tokens returned {num_tokens}")
            batch = batch_drafts(self, num_tokens_per_req, draft_tokens)
            tables = self.cost_tables
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as error:
            _step_aside(error)
            return num_tokens
        chosen = budget.choose(batch, tables)
        budget.record(batch, chosen, vllm_budget)
        self._batch_budget = (drafts_per_req, other_per_req, chosen)
        return other + chosen

    return get_num_tokens


def install_budget_hook() -> bool:
    """Apply P3 once per process; True if it is (now or already) in place."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
    )

    from vllm_ext.guards import patch_method

    return patch_method(
        AdaptiveVerificationManager, "get_num_tokens", _budgeted_get_num_tokens,
        EXPECTED_PARAMS,
        refused="vLLM's adaptive verification chooses the draft budget alone",
        applied="draft budget under the load-aware policy")
