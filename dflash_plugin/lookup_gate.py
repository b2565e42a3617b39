"""What lookup-only steps actually brought, timed against the draft-free steps beside them.

A step that verifies prompt-lookup drafts and runs no draft pass costs only a longer target
step. The policy prices that as `verify_per_token` a token, a line fitted over all steps; under
load on a CPU the real extra time of such a step was about twice that (a step with drafts also
runs the rejection sampler and wider attention, which a draft-free step skips). So each
lookup-only step is booked by its own time: the recent draft-free steps of the same batch size
give the reference R, and the step gained

    accepted tokens x R / batch  -  (its time - R)

in units of R. Both times run from the end of one proposal to the end of the next, less any
draft pass: the proposal after a step that verified drafts does vLLM's rejected-token
bookkeeping, several times the draft-free short cut's. Where no time is at hand (a
tensor-parallel engine, whose ranks must decide alike), the cost model prices the extra tokens
instead. The model misses a drafted step's fixed extra cost, which grows with the batch (on a
CPU under load 10-25 ms at 16-32 requests, whatever the number of drafts), and under load
nearly every step verifies some lookup draft, so a batch size may never see a draft-free step:
while steps are timed, a batch size without a fresh reference (`wants_reference`) runs one
draft-free step instead of a lookup-only one. Bands of batch sizes close and re-open as the
draft-pass gate's do (pass_gate.PassGate); a closed band runs no lookup-only steps.
"""

from __future__ import annotations

import statistics
from collections import deque

from dflash_plugin.pass_gate import CostModel, PassGate
from dflash_plugin.step_clock import GAP_FACTOR  # above it: an idle gap, not a cost

KEEP = 16  # newest draft-free step times kept per batch size
MIN_SAMPLES = 3  # draft-free steps a batch size needs before it is a reference
REFRESH = 64  # lookup-only steps booked against one reference before it wants a new sample


class DraftFreeSteps:
    """The recent times of steps that verified no drafts, per batch size."""

    def __init__(self, keep: int = KEEP, min_samples: int = MIN_SAMPLES,
                 refresh: int = REFRESH):
        self.keep, self.min_samples, self.refresh = keep, min_samples, refresh
        self._times: dict[int, deque[float]] = {}
        self._used: dict[int, int] = {}  # lookup steps booked since the batch's newest sample

    def add(self, batch: int, ms: float):
        if batch >= 1 and ms > 0:
            self._times.setdefault(batch, deque(maxlen=self.keep)).append(float(ms))
            self._used[batch] = 0

    def used(self, batch: int):
        """A lookup-only step of this batch size was booked."""
        self._used[batch] = self._used.get(batch, 0) + 1

    def stale(self, batch: int) -> bool:
        """Too few samples for a reference, or one used for `refresh` lookup steps."""
        times = self._times.get(batch)
        return (times is None or len(times) < self.min_samples
                or self._used.get(batch, 0) >= self.refresh)

    def reference(self, batch: int) -> float | None:
        """The median of this batch size's recent draft-free steps (None: too few yet)."""
        times = self._times.get(batch)
        if times is None or len(times) < self.min_samples:
            return None
        return statistics.median(times)


class LookupGate:
    """Per band of batch sizes: the decayed mean net value of recent lookup-only steps."""

    def __init__(self, gate: PassGate | None = None, gap_factor: float = GAP_FACTOR):
        self.gate = gate if gate is not None else PassGate()
        self.draft_free = DraftFreeSteps()
        self.gap_factor = gap_factor
        self.timed = 0  # lookup-only steps booked by their measured time (diagnostics)
        self.priced = 0  # ... and by the cost model
        self.references = 0  # lookup-only steps left draft-free for a reference
        self._timing = False  # steps are timed here (never on a tensor-parallel engine)

    def draft_free_step(self, batch: int, ms: float):
        """A step that verified no drafts at all, for `batch` requests, took `ms`."""
        self._timing = True
        self.draft_free.add(batch, ms)

    def wants_reference(self, batch: int) -> bool:
        """Steps are timed and this batch size has no fresh draft-free time: the caller leaves
        this step draft-free (counted here) so the next lookup-only steps are booked by time."""
        if not (self._timing and self.draft_free.stale(batch)):
            return False
        self.references += 1
        return True

    def lookup_step(self, costs: CostModel, batch: int, verified: int, accepted: int,
                    ms: float | None = None):
        """A lookup-only step verified `verified` drafts for `batch` requests and `accepted` of
        them were taken; `ms`: its measured time (None: not measured)."""
        if batch < 1:
            return
        self.draft_free.used(batch)
        reference = self.draft_free.reference(batch) if ms is not None else None
        if reference is not None:
            if not 0 < ms <= self.gap_factor * reference:
                return  # an idle gap or a stall says nothing about the drafts
            self.timed += 1
            self.gate.record_value(batch, accepted / batch - (ms - reference) / reference)
            return
        self.priced += 1
        plain = costs.verify_time(batch)
        self.gate.record_value(batch, (accepted * plain / batch
                                       - costs.verify_per_token * verified) / plain)

    def allows(self, costs: CostModel, batch: int, verified: int) -> bool:
        """May a step at this batch verify `verified` lookup drafts (and no draft pass)?"""
        return self.gate.allows(costs, batch, probe=costs.verify_per_token * max(verified, 1))

    def waits(self, costs: CostModel, batch: int) -> bool:
        """Lookup at this batch is sure to be refused this step (PassGate.waits): the caller
        may leave the lookup itself out."""
        return self.gate.waits(costs, batch, probe=costs.verify_per_token)

    def closed(self, batch: int) -> bool:
        return self.gate.closed(batch)

    def summary(self) -> str:
        return (self.gate.summary("lookup-only steps", "step")
                + f"; {self.timed} timed, {self.priced} priced, "
                  f"{self.references} left draft-free for a reference")
