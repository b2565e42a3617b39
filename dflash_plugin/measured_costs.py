"""The draft policy's cost model fitted to measured step times.

A table of step times (the target verifying L tokens for each of B requests, and the draft pass
for B requests) becomes the policy's linear `CostModel` in units of one plain single-request
step. The fit minimises relative error, so small steps, where the policy's decisions at low
load are made, weigh as much as large ones. The CUDA preset is this fit of a table measured on
one GPU (`CUDA_TIMINGS_FILE`, made by tools/measure_cuda_step_costs.py); the vLLM plugin fits
the steps it serves with the same `relative_fit` (dflash_plugin.step_clock).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path


from dflash_plugin.draft_policy import CostModel

# One NVIDIA H200, bf16, random weights in Qwen3-8B's shape, CUDA graphs, 1,024-token context
# (docs/bench/cuda-h200-8b-step-costs.json has the same table).
CUDA_TIMINGS_FILE = Path(__file__).resolve().parent / "data" / "cuda-h200-8b-step-costs.json"


@dataclass(frozen=True)
class StepTimings:
    """Measured step times in milliseconds."""

    verify_ms: dict[tuple[int, int], float]  # (batch, tokens per request) -> target step
    draft_ms: dict[int, float]  # batch -> one draft pass

    def __post_init__(self):
        if (1, 1) not in self.verify_ms:
            raise ValueError("step timings need the plain single-request step (batch 1, 1 token)")
        if len(self.draft_ms) < 2:
            raise ValueError("step timings need draft passes at two or more batch sizes")
        for key, ms in [*self.verify_ms.items(), *self.draft_ms.items()]:
            if not ms > 0:
                raise ValueError(f"step timing {key}: {ms!r} ms is not a positive time")

    @property
    def plain_ms(self) -> float:
        return self.verify_ms[(1, 1)]


def relative_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum(((a + b x) - y) / y)^2 (its 2x2 normal equations, in plain
    floats so that the same table always gives the same model)."""
    s00 = sum(1 / y ** 2 for y in ys)
    s01 = sum(x / y ** 2 for x, y in zip(xs, ys))
    s11 = sum(x * x / y ** 2 for x, y in zip(xs, ys))
    t0 = sum(1 / y for y in ys)
    t1 = sum(x / y for x, y in zip(xs, ys))
    det = s00 * s11 - s01 * s01
    a, b = ((t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det) if det > 0 else (-1.0, -1.0)
    if b < 0:  # times that fall with size (or one size only): the best flat model
        a, b = t0 / s00, 0.0
    if a < 0:
        a, b = 0.0, t1 / s11
    return a, b


def fit_cost_model(timings: StepTimings, base: CostModel | None = None) -> CostModel:
    """The linear cost model closest (in relative error) to `timings`, keeping `base`'s
    speed-up bars."""
    plain = timings.plain_ms
    tokens, verify = zip(*[(batch * length, ms / plain)
                           for (batch, length), ms in sorted(timings.verify_ms.items())])
    batches, draft = zip(*[(batch, ms / plain) for batch, ms in sorted(timings.draft_ms.items())])
    verify_fixed, verify_per_token = relative_fit(list(tokens), list(verify))
    draft_fixed, draft_per_request = relative_fit(list(batches), list(draft))
    fitted = CostModel(verify_fixed=verify_fixed, verify_per_token=verify_per_token,
                       draft_fixed=draft_fixed, draft_per_request=draft_per_request)
    if base is None:
        return fitted
    return replace(base, verify_fixed=fitted.verify_fixed,
                   verify_per_token=fitted.verify_per_token, draft_fixed=fitted.draft_fixed,
                   draft_per_request=fitted.draft_per_request)


def read_timings(path: Path, num_draft_layers: int) -> StepTimings:
    """The table written by tools/measure_cuda_step_costs.py, with the draft pass of the
    measured depth nearest to `num_draft_layers` scaled linearly between measured depths."""
    data = json.loads(Path(path).read_text())
    verify = {tuple(int(v) for v in key.split("x")): float(ms)
              for key, ms in data["target_ms"].items()}
    by_depth: dict[int, dict[int, float]] = {}
    for key, ms in data["draft_ms"].items():
        batch, depth = (int(v) for v in key.split("x"))
        by_depth.setdefault(depth, {})[batch] = float(ms)
    return StepTimings(verify, _draft_at_depth(by_depth, num_draft_layers))


def _draft_at_depth(by_depth: dict[int, dict[int, float]], depth: int) -> dict[int, float]:
    """Draft-pass times for `depth` layers: measured, or interpolated (extrapolated past the
    ends) from the two nearest measured depths; each layer costs about the same."""
    if depth < 1:
        raise ValueError(f"a drafter has at least one layer, got {depth}")
    if depth in by_depth:
        return by_depth[depth]
    depths = sorted(by_depth)
    lower = max([d for d in depths if d < depth], default=depths[0])
    upper = min([d for d in depths if d > depth], default=depths[-1])
    if lower == upper:  # outside the measured depths: the two nearest on that side
        lower, upper = (depths[0], depths[1]) if depth < depths[0] else (depths[-2], depths[-1])
    weight = (depth - lower) / (upper - lower)
    return {batch: max(by_depth[lower][batch] + weight * (by_depth[upper][batch]
                                                          - by_depth[lower][batch]), 1e-6)
            for batch in by_depth[lower] if batch in by_depth[upper]}


def cuda_costs(num_draft_layers: int | None = None) -> CostModel:
    """The CUDA preset: the fit of the measured GPU table, for a drafter of this depth
    (default 5 layers, the public 8B drafters' depth)."""
    return _cuda_costs_at(num_draft_layers or 5)


@functools.lru_cache(maxsize=None)
def _cuda_costs_at(num_draft_layers: int) -> CostModel:
    return fit_cost_model(read_timings(CUDA_TIMINGS_FILE, num_draft_layers))
