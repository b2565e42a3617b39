"""The draft policy's step costs measured on the steps an engine really serves.

The presets of `draft_policy` were measured on a few machines; on another CPU (or GPU) the ratio
of a step's fixed cost to its per-token cost differs, and so do the right draft lengths. A
`StepClock` is handed the wall time of every real decoding step of the target (from the end of
one draft proposal to the start of the next: the target's forward pass, sampling, input
preparation and the scheduler, everything a step pays) and of every draft pass, and every
`refit_every` decoding steps fits the policy's linear `CostModel` to them:

- target steps are grouped by N, the tokens the target processed in the step (all requests);
  each group's median (after dropping idle gaps: times far above that median) is one point, and
  where the groups of `min_samples` each span N by a factor of `SPAN` or more the verify line is
  fitted through them (`measured_costs.relative_fit`, the fit the CUDA preset comes from). The
  unit of the model is then the measured plain single-request step, the line at N = 1. Over a
  narrower span (a server under steady load serves N = 25-32 only) the slope is noise, and a fit
  that came out flat or through the origin is no line at all: a flat one made verifying 150
  drafts look free and a server drafted whole blocks for 30 requests at 0.71x plain
  (docs/benchmarks.md). So there, and where a fit is degenerate, the preset's verify line is
  kept and only sets the unit (scaled through the measured points); with no group, the preset
  is kept whole;
- draft passes are grouped by batch size B the same way: a line fitted where the sizes span
  SPAN, the preset's draft line scaled through the measured points where they do not (or the fit
  is degenerate), the preset's with none.

Steps whose longest query is longer than one token plus the drafts (prefill and chunked prefill)
say nothing about decoding and are left out, and so are their draft passes (they write the whole
prompt's context). The preset's speed-up bars and every field the user set (`pinned`, e.g. from
DFLASH_COST_MODEL) are kept. Old samples age out (`window` steps), so a machine that gets busier
or quieter is followed. The same samples always give the same model; when a refit is due depends
only on the steps' shapes, never on their times, so every tensor-parallel rank reaches it at the
same step.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from dflash_plugin.draft_policy import CostModel
from dflash_plugin.measured_costs import relative_fit

REFIT_EVERY = 256  # decoding steps between refits
MIN_SAMPLES = 5  # samples a group needs to be a point of the fit
GAP_FACTOR = 3.0  # a time above this many times its group's median is an idle gap, not a step
SPAN = 4.0  # the largest size must be this many times the smallest for a line of its own
KEEP = 64  # newest samples kept per group
WINDOW = 16 * REFIT_EVERY  # samples older than this many decoding steps are forgotten

COST_TERMS = ("verify_fixed", "verify_per_token", "draft_fixed", "draft_per_request")


@dataclass(frozen=True)
class MeasuredCosts:
    """One refit's answer: the model, and where each of its lines came from."""

    costs: CostModel
    steps: int  # decoding steps timed so far
    verify: str  # "measured" or "preset"
    draft: str  # "measured", "scaled" (the preset's line through one measured batch) or "preset"
    plain_ms: float | None  # the model's unit in milliseconds (None: nothing measured)

    def summary(self) -> str:
        c = self.costs
        unit = f"; 1 unit = {self.plain_ms:.3g} ms" if self.plain_ms is not None else ""
        return (f"verify {c.verify_fixed:.3g} + {c.verify_per_token:.3g} x N ({self.verify}), "
                f"draft pass {c.draft_fixed:.3g} + {c.draft_per_request:.3g} x B ({self.draft})"
                f"{unit}")


class StepClock:
    """Step times of real decoding steps -> the draft policy's CostModel (module docstring)."""

    def __init__(self, preset: CostModel, max_decode_query: int, *,
                 refit_every: int = REFIT_EVERY, pinned: Iterable[str] = (),
                 min_samples: int = MIN_SAMPLES, gap_factor: float = GAP_FACTOR,
                 keep: int = KEEP, window: int = WINDOW):
        if max_decode_query < 1:
            raise ValueError(f"max_decode_query must be >= 1, got {max_decode_query}")
        unknown = set(pinned) - {f.name for f in fields(CostModel)}
        if unknown:
            raise ValueError(f"pinned cost fields {sorted(unknown)} are not CostModel fields")
        self.preset = preset
        self.max_decode_query = max_decode_query  # 1 + num_speculative_tokens
        self.refit_every = refit_every  # 0: never refit
        self.pinned = frozenset(pinned)
        self.min_samples = max(1, min_samples)
        self.gap_factor = gap_factor
        self.keep = keep
        self.window = window
        self.steps = 0  # decoding steps seen (timed or not)
        self.draft_passes = 0  # decoding draft passes timed
        # group -> (step index, ms) of its newest samples
        self._verify: dict[int, deque[tuple[int, float]]] = {}
        self._draft: dict[int, deque[tuple[int, float]]] = {}

    def is_decode(self, max_query: int) -> bool:
        """A step whose every request processed at most its bonus token and its drafts."""
        return 0 < max_query <= self.max_decode_query

    def target_step(self, num_tokens: int, batch: int, max_query: int, ms: float) -> bool:
        """A target step of `num_tokens` tokens for `batch` requests, the longest query
        `max_query` tokens, taking `ms`. True when a refit is due (call `fit`)."""
        if batch < 1 or not self.is_decode(max_query):
            return False
        self.steps += 1
        if _usable(ms) and num_tokens >= 1:
            self._add(self._verify, int(num_tokens), ms)
        return self.refit_every > 0 and self.steps % self.refit_every == 0

    def draft_pass(self, batch: int, max_query: int, ms: float):
        """A draft pass for `batch` requests, in a step whose longest query was `max_query`."""
        if batch >= 1 and self.is_decode(max_query) and _usable(ms):
            self.draft_passes += 1
            self._add(self._draft, int(batch), ms)

    def _add(self, groups: dict[int, deque[tuple[int, float]]], key: int, ms: float):
        group = groups.get(key)
        if group is None:
            group = groups[key] = deque(maxlen=self.keep)
        group.append((self.steps, float(ms)))

    def _points(self, groups: dict[int, deque[tuple[int, float]]]) -> dict[int, float]:
        """Each group with enough recent samples -> its median time, idle gaps left out."""
        oldest = self.steps - self.window
        points = {}
        for key in sorted(groups):
            times = [ms for step, ms in groups[key] if step > oldest]
            if len(times) < self.min_samples:
                continue
            bar = self.gap_factor * statistics.median(times)
            times = [ms for ms in times if ms <= bar]
            if len(times) >= self.min_samples:
                points[key] = statistics.median(times)
        return points

    def fit(self) -> MeasuredCosts:
        """The cost model of the samples so far (the preset where they say too little)."""
        preset = self.preset
        verify = self._points(self._verify)
        draft = self._points(self._draft)
        terms = {name: getattr(preset, name) for name in COST_TERMS}
        verify_source, draft_source, unit_ms = "preset", "preset", None
        line = _line(verify)
        if line is not None:
            fixed, per_token = line
            unit_ms = fixed + per_token  # the line at N = 1: one plain single-request step
            terms.update(verify_fixed=fixed / unit_ms, verify_per_token=per_token / unit_ms)
            verify_source = "measured"
        elif verify:
            unit_ms = _scale(verify, preset.verify_time)
        if unit_ms is not None and draft:
            points = {batch: ms / unit_ms for batch, ms in draft.items()}
            line = _line(points)
            if line is not None:
                terms.update(draft_fixed=line[0], draft_per_request=line[1])
                draft_source = "measured"
            else:  # the preset's shape, or a fixed cost where the preset prices drafts at 0
                fixed, per_request = ((preset.draft_fixed, preset.draft_per_request)
                                      if preset.draft_fixed + preset.draft_per_request > 0
                                      else (1.0, 0.0))
                factor = _scale(points, lambda batch: fixed + per_request * batch)
                terms.update(draft_fixed=fixed * factor, draft_per_request=per_request * factor)
                draft_source = "scaled"
        for name in self.pinned & terms.keys():
            terms[name] = getattr(preset, name)
        return MeasuredCosts(replace(preset, **terms), self.steps, verify_source, draft_source,
                             unit_ms)


def _line(points: dict[int, float]) -> tuple[float, float] | None:
    """(fixed, per-unit) of the line fitted through `points` (size -> time), or None where
    they cannot tell a line: sizes spanning less than SPAN, or a fit clamped flat or through the
    origin (times that fall with size, or noise over a short span)."""
    if len(points) < 2 or max(points) < SPAN * min(points):
        return None
    sizes = list(points)
    fixed, per_unit = relative_fit([float(n) for n in sizes], [points[n] for n in sizes])
    return (fixed, per_unit) if fixed > 0 and per_unit > 0 else None


def _scale(points: dict[int, float], shape) -> float:
    """The factor s that brings s * shape(size) closest to `points` in relative error (the
    fit's measure): a preset's line kept, through the measured times."""
    ratios = [shape(size) / time for size, time in points.items()]
    return sum(ratios) / sum(r * r for r in ratios)


def _usable(ms: float) -> bool:
    return isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0
