"""What draft passes actually brought, per band of batch sizes, and a veto where they lost time.

The policy decides before a draft pass from expected acceptance; a pass whose drafts then look
too weak to verify is paid for and brings nothing. `PassGate` books each pass's realised value
in cost units: the plain-step time its accepted tokens saved, less the pass and the verified
drafts. A band whose recent passes lost time is closed once that is clear from their spread
(the mean plus one standard error is below zero: one pass's value swings by more than a plain
step, so a short run of rejections must not close a band that pays), and so is every band above
it (a pass costs more per request as the batch grows, and a draft's value shrinks). The lowest
closed band re-opens for one pass now and then, at most `explore_share` of its steps' time, so a
drafter that starts accepting, or cheaper measured costs, are noticed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class CostModel(Protocol):
    """What the gate reads of draft_policy.CostModel (which imports this module)."""

    verify_per_token: float

    def verify_time(self, num_tokens: int | float) -> float: ...

    def draft_time(self, num_requests: int) -> float: ...


def band_of(batch: int) -> int:
    """Bands of batch sizes: 1, 2-3, 4-7, 8-15, ... -> 1, 2, 3, 4, ..."""
    return max(int(batch), 1).bit_length()


@dataclass
class BandRecord:
    net: float = 0.0  # decayed sum of the passes' net values (cost units)
    squares: float = 0.0  # decayed sum of their squares
    weight: float = 0.0  # decayed number of passes
    passes: int = 0
    steps_closed: int = 0  # steps at this band without a pass since it closed (or last explored)
    probe: float | None = None  # what the last try refused here would have cost


class PassGate:
    """Per band: the decayed mean net value of recent draft passes; see the module's doc."""

    def __init__(self, min_passes: int = 3, decay: float = 0.95, explore_share: float = 0.005):
        if min_passes <= 0 or not 0 < decay <= 1 or not 0 < explore_share <= 1:
            raise ValueError("PassGate: min_passes > 0, 0 < decay <= 1, 0 < explore_share <= 1")
        self.min_passes = min_passes
        self.decay = decay
        self.explore_share = explore_share
        self.bands: dict[int, BandRecord] = {}
        self.vetoed = 0  # draft passes refused (diagnostics)

    @staticmethod
    def pass_value(costs: CostModel, batch: int, verified: int, accepted: int) -> float:
        """Net time a draft pass at `batch` gained: the plain-step time of its `accepted` tokens
        less the pass and the `verified` drafts' share of the target step."""
        token_time = costs.verify_time(batch) / batch
        return (accepted * token_time - costs.draft_time(batch)
                - costs.verify_per_token * verified)

    def record(self, costs: CostModel, batch: int, verified: int, accepted: int):
        """One draft pass's outcome (`verified` drafts handed out, `accepted` of them taken)."""
        self.record_value(batch, self.pass_value(costs, batch, verified, accepted))

    def record_value(self, batch: int, value: float):
        """One outcome at `batch` worth `value` (cost units, net of what it cost)."""
        if batch < 1:
            return
        rec = self.bands.setdefault(band_of(batch), BandRecord())
        rec.net = rec.net * self.decay + value
        rec.squares = rec.squares * self.decay + value * value
        rec.weight = rec.weight * self.decay + 1.0
        rec.passes += 1
        rec.steps_closed = 0

    def losing(self, b: int) -> bool:
        rec = self.bands.get(b)
        if rec is None or rec.passes < self.min_passes:
            return False
        mean = rec.net / rec.weight
        spread = max(rec.squares / rec.weight - mean * mean, 0.0)
        return mean + math.sqrt(spread / rec.weight) < 0

    def _lowest_losing(self, b: int) -> int | None:
        return next((x for x in range(1, b + 1) if self.losing(x)), None)

    def closed(self, batch: int) -> bool:
        """Whether passes at this batch are refused (exploration aside); changes nothing."""
        return self._lowest_losing(band_of(batch)) is not None

    def allows(self, costs: CostModel, batch: int, probe: float | None = None) -> bool:
        """May a draft pass run at this batch? Counts the step against a closed band's wait.
        `probe`: what one exploring try costs (default: a draft pass at this batch)."""
        b = band_of(batch)
        lowest = self._lowest_losing(b)
        if lowest is None:
            return True
        if lowest < b:  # a smaller batch already loses: this one would lose more
            self.vetoed += 1
            return False
        rec = self.bands[b]
        rec.steps_closed += 1
        rec.probe = costs.draft_time(batch) if probe is None else probe
        if rec.steps_closed >= self._wait(costs, batch, rec.probe):
            rec.steps_closed = 0  # the next try waits as long, even if this one is not booked
            return True  # explore: its outcome is booked like any other pass
        self.vetoed += 1
        return False

    def waits(self, costs: CostModel, batch: int, probe: float) -> bool:
        """Whether a try at this batch is sure to be refused, asked before its size is known
        (so that a caller can skip preparing it): a band at or below this one is closed and
        this band's next exploring try is not due. Such a step counts against the wait as a
        refused `allows` does, priced like the last refused try (else `probe`); where a try is
        due nothing is counted, and the caller's `allows` then grants it."""
        b = band_of(batch)
        lowest = self._lowest_losing(b)
        if lowest is None:
            return False
        if lowest < b:
            return True
        rec = self.bands[b]
        wait = self._wait(costs, batch, rec.probe if rec.probe is not None else probe)
        if rec.steps_closed + 1 >= wait:
            return False
        rec.steps_closed += 1
        return True

    def _wait(self, costs: CostModel, batch: int, probe: float) -> int:
        """Steps a closed band waits between tries costing `probe`: its explore share."""
        return math.ceil(probe / (self.explore_share * costs.verify_time(batch)))

    def summary(self, what: str = "draft passes", unit: str = "pass") -> str:
        parts = []
        for b in sorted(self.bands):
            rec = self.bands[b]
            low, high = 1 << (b - 1), (1 << b) - 1
            span = f"{low}" if low == high else f"{low}-{high}"
            state = "closed" if self.losing(b) else "open"
            mean = rec.net / rec.weight if rec.weight else 0.0
            parts.append(f"{span} requests {state} ({mean:+.2f} per {unit})")
        return f"{what} by batch: " + (", ".join(parts) or "none yet") + \
            f"; {self.vetoed} vetoed"
