"""The draft policy's step costs measured on the steps an engine really serves.

The presets of `draft_policy` were measured on a few machines; on another CPU (or GPU) the ratio
of a step's fixed cost to its per-token cost differs, and so do the right draft lengths. A
`StepClock` is handed the wall time of every real decoding step of the target (from the end of
one draft proposal to the start of the next: the target's forward pass, sampling, input
preparation and the scheduler, everything a step pays) and of every draft pass, and every
`refit_every` decoding steps fits the policy's linear `CostModel` to them:

- target steps are grouped by N, the tokens the target processed in the step (all requests);
  each group's median (after dropping idle gaps: times far above that median) is one point, and
  with two or more groups of `min_samples` each the verify line is fitted through them
  (`measured_costs.relative_fit`, the fit the CUDA preset comes from). The unit of the model is
  then the measured plain single-request step, the line at N = 1. With one group only, the
  preset's verify line is kept and only sets the unit (its time at that N is the measured one);
  with none, the preset is kept whole;
- draft passes are grouped by batch size B the same way: fitted with two or more sizes, the
  preset's draft line scaled through the one measured point with one, the preset's with none.

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
        if len(verify) >= 2:
            sizes = list(verify)
            fixed, per_token = relative_fit([float(n) for n in sizes], [verify[n] for n in sizes])
            unit_ms = fixed + per_token  # the line at N = 1: one plain single-request step
            terms.update(verify_fixed=fixed / unit_ms, verify_per_token=per_token / unit_ms)
            verify_source = "measured"
        elif len(verify) == 1:
            (size, ms), = verify.items()
            unit_ms = ms / preset.verify_time(size)
        if unit_ms is not None and len(draft) >= 2:
            batches = list(draft)
            fixed, per_request = relative_fit([float(b) for b in batches],
                                              [draft[b] / unit_ms for b in batches])
            terms.update(draft_fixed=fixed, draft_per_request=per_request)
            draft_source = "measured"
        elif unit_ms is not None and len(draft) == 1:
            (batch, ms), = draft.items()
            observed, expected = ms / unit_ms, preset.draft_time(batch)
            if expected > 0:
                terms.update(draft_fixed=preset.draft_fixed * observed / expected,
                             draft_per_request=preset.draft_per_request * observed / expected)
            else:
                terms.update(draft_fixed=observed, draft_per_request=0.0)
            draft_source = "scaled"
        for name in self.pinned & terms.keys():
            terms[name] = getattr(preset, name)
        return MeasuredCosts(replace(preset, **terms), self.steps, verify_source, draft_source,
                             unit_ms)


def _usable(ms: float) -> bool:
    return isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0
