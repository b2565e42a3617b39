"""The draft policy's cost model, measured: a running least-squares fit of timed steps.

A preset cost model (draft_policy.CPU_COSTS / CUDA_COSTS) is right only on the machine, engine
and drafter it was measured for; on this project's reference path, for example, a draft pass
costs about three times what the vLLM-CPU preset says. Step costs, unlike acceptance, change
slowly, so they can be learnt from the steps the engine runs anyway:

    seconds = verify_fixed + verify_per_token * target_tokens
              + drafted * (draft_fixed + draft_per_request * batch)

(target_tokens: tokens the target processed, i.e. the batch plus the drafts it verified;
drafted: the step ran a draft pass.) The fit is ridge regression towards the preset, scaled
to seconds by the first steps' timings and worth about one step, so that what the data cannot
tell apart (at batch 1 the two draft terms are one) takes the smallest change to the preset.
Old steps are forgotten slowly (longer contexts, other load), and one step's time is clipped at
`max_ratio` (2) times the fit's prediction so a stall of the machine cannot drag the fit.
Engine-free, like the policy it feeds.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dflash_plugin.draft_policy import CostModel

# Typical size of each regressor (1, target tokens, drafted, drafted x batch): the preset is
# worth `prior_steps` steps of that size, whatever the units of the coefficient.
_TYPICAL = torch.tensor([1.0, 8.0, 1.0, 4.0], dtype=torch.float64)


def _regressors(batch: int, target_tokens: int, drafted: bool) -> torch.Tensor:
    d = float(drafted)
    return torch.tensor([1.0, float(target_tokens), d, d * batch], dtype=torch.float64)


def _coefficients(costs: CostModel) -> torch.Tensor:
    return torch.tensor([costs.verify_fixed, costs.verify_per_token, costs.draft_fixed,
                         costs.draft_per_request], dtype=torch.float64)


class StepCostFit:
    def __init__(self, prior: CostModel, prior_steps: float = 1.0, forget: float = 0.998,
                 warmup_steps: int = 8, refit_every: int = 16, max_ratio: float = 2.0):
        if prior_steps <= 0 or not 0 < forget <= 1 or warmup_steps < 1 or refit_every < 1 \
                or max_ratio <= 1:
            raise ValueError("step cost fit: prior_steps > 0, 0 < forget <= 1, warmup_steps >= 1, "
                             "refit_every >= 1 and max_ratio > 1 are required")
        self.prior = prior
        self.forget = forget
        self.warmup_steps = warmup_steps
        self.refit_every = refit_every
        self.max_ratio = max_ratio
        self._prior_coef = _coefficients(prior)
        self._prior_precision = torch.diag(prior_steps * _TYPICAL ** 2)
        self._gram = torch.zeros(4, 4, dtype=torch.float64)  # forgetting sum of x x^T
        self._moment = torch.zeros(4, dtype=torch.float64)  # forgetting sum of x * seconds
        self._warmup: list[tuple[torch.Tensor, float]] = []
        self._scale: float | None = None  # seconds per preset unit (set after warm-up)
        self._coef: torch.Tensor | None = None  # current fit, in seconds
        self._since_refit = 0
        self.steps_seen = 0
        self.costs = prior  # what the policy should use now (units: one plain step, batch 1)

    def record(self, batch: int, target_tokens: int, drafted: bool, seconds: float) -> bool:
        """One timed step. True when the fitted costs changed (the policy re-plans)."""
        if batch < 1 or target_tokens < batch or not seconds > 0:
            return False
        x = _regressors(batch, target_tokens, drafted)
        self.steps_seen += 1
        if self._scale is None:
            self._warmup.append((x, seconds))
            if len(self._warmup) < self.warmup_steps:
                return False
            predicted = sum(float(xi @ self._prior_coef) for xi, _ in self._warmup)
            self._scale = sum(s for _, s in self._warmup) / predicted
            pending, self._warmup = self._warmup, []
            for xi, s in pending:
                self._add(xi, s)
            return self._refit()
        if self._coef is not None:
            # A stalled step (page fault, another process) says nothing about drafting.
            seconds = min(seconds, self.max_ratio * float(x @ self._coef))
        self._add(x, seconds)
        self._since_refit += 1
        return self._since_refit >= self.refit_every and self._refit()

    def _add(self, x: torch.Tensor, seconds: float):
        self._gram.mul_(self.forget).add_(torch.outer(x, x))
        self._moment.mul_(self.forget).add_(x * seconds)

    def _refit(self) -> bool:
        self._since_refit = 0
        prior_coef = self._prior_coef * self._scale  # the preset, in seconds
        coef = torch.linalg.solve(self._prior_precision + self._gram,
                                  self._prior_precision @ prior_coef + self._moment)
        coef = coef.clamp(min=0.0)
        unit = float(coef[0] + coef[1])  # one plain step of one request, in seconds
        if unit <= 0:
            return False  # no usable fit yet: keep the last costs
        self._coef = coef
        fixed, per_token, draft_fixed, draft_per_request = (coef / unit).tolist()
        costs = replace(self.prior, verify_fixed=fixed, verify_per_token=per_token,
                        draft_fixed=draft_fixed, draft_per_request=draft_per_request)
        changed = costs != self.costs
        self.costs = costs
        return changed

    @property
    def seconds_per_plain_step(self) -> float | None:
        """The fit's time of one plain single-request step (None before warm-up ends)."""
        return None if self._coef is None else float(self._coef[0] + self._coef[1])
