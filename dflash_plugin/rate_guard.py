"""Never slower than plain decoding, by measurement.

The draft policy's cost model is an estimate: on a machine, engine or drafter it was not
measured for, it can judge a draft pass worth its price when it is not. This guard times the
engine's real decoding steps, per batch-size bucket, in two arms: steps that ran the draft pass
("drafted") and steps that did not ("plain"), as emitted tokens per second (smoothed). Where
drafting is measured slower than plain, the policy drafts only as a rare probe; the plain arm is
re-measured now and then so that a slow drift (longer contexts, other load) cannot lock in a
stale verdict. Engine-free: the adapter hands in (batch, drafted?, tokens, seconds) per step.
"""

from __future__ import annotations

from dataclasses import dataclass


def batch_bucket(batch: int) -> int:
    """1 | 2-3 | 4-7 | 8-15 | ...: steps of similar batch size share their measurements."""
    return max(1, batch).bit_length()


@dataclass
class ArmRate:
    """Smoothed emitted tokens per second of one arm in one bucket."""

    rate: float = 0.0
    samples: int = 0

    def add(self, rate: float, smoothing: float):
        # A plain mean for the first samples, then exponential forgetting.
        weight = max(smoothing, 1.0 / (self.samples + 1))
        self.rate += weight * (rate - self.rate)
        self.samples += 1


class RateGuard:
    def __init__(self, min_samples: int = 3, smoothing: float = 0.1, margin: float = 1.0,
                 refresh_plain_every: int = 200):
        if min_samples < 1 or not 0 < smoothing <= 1 or margin <= 0 or refresh_plain_every < 1:
            raise ValueError("rate guard: min_samples >= 1, 0 < smoothing <= 1, margin > 0 and "
                             "refresh_plain_every >= 1 are required")
        self.min_samples = min_samples
        self.smoothing = smoothing
        self.margin = margin  # drafting must reach margin x the plain rate to be allowed
        self.refresh_plain_every = refresh_plain_every
        self._arms: dict[tuple[int, bool], ArmRate] = {}
        self._drafted_since_plain: dict[int, int] = {}
        # Plain steps asked for since the last plain measurement: where the engine never has a
        # clean step to time, stop asking rather than never drafting.
        self._plain_asks: dict[int, int] = {}
        self.max_plain_asks = 4 * min_samples

    def arm(self, batch: int, drafted: bool) -> ArmRate:
        return self._arms.setdefault((batch_bucket(batch), drafted), ArmRate())

    def record(self, batch: int, drafted: bool, tokens: int, seconds: float):
        """One clean decoding step: `tokens` emitted for `batch` requests in `seconds`."""
        if batch < 1 or tokens < 1 or not seconds > 0:
            return
        self.arm(batch, drafted).add(tokens / seconds, self.smoothing)
        bucket = batch_bucket(batch)
        if drafted:
            self._drafted_since_plain[bucket] = self._drafted_since_plain.get(bucket, 0) + 1
        else:
            self._drafted_since_plain[bucket] = 0
            self._plain_asks[bucket] = 0

    def needs_plain_sample(self, batch: int) -> bool:
        """Plain steps are due: too few so far, or none for a long run of drafted steps.
        Counts as a request for one plain step."""
        bucket = batch_bucket(batch)
        due = (self.arm(batch, False).samples < self.min_samples
               or self._drafted_since_plain.get(bucket, 0) >= self.refresh_plain_every)
        if not due or self._plain_asks.get(bucket, 0) >= self.max_plain_asks:
            return False
        self._plain_asks[bucket] = self._plain_asks.get(bucket, 0) + 1
        return True

    def drafting_loses(self, batch: int) -> bool:
        """Both arms measured here, and drafting emits tokens slower than plain decoding."""
        plain, drafted = self.arm(batch, False), self.arm(batch, True)
        if plain.samples < self.min_samples or drafted.samples < self.min_samples:
            return False
        return drafted.rate < self.margin * plain.rate

    def speedups_by_bucket(self) -> dict[int, float]:
        """{bucket: measured drafted/plain rate ratio} where both arms have samples."""
        ratios = {bucket: self._ratio(bucket) for bucket in sorted({b for b, _ in self._arms})}
        return {bucket: ratio for bucket, ratio in ratios.items() if ratio is not None}

    def speedup(self, batch: int) -> float | None:
        """Measured drafted/plain rate ratio in this batch's bucket (None until both known)."""
        return self._ratio(batch_bucket(batch))

    def _ratio(self, bucket: int) -> float | None:
        plain, drafted = self._arms.get((bucket, False)), self._arms.get((bucket, True))
        if plain is None or drafted is None or not plain.samples or not drafted.samples \
                or plain.rate <= 0:
            return None
        return drafted.rate / plain.rate


@dataclass
class PooledRate:
    """Emitted tokens and seconds pooled over one arm's windows in one bucket; older windows
    fade by a constant factor per new window of that arm."""

    tokens: float = 0.0
    seconds: float = 0.0
    windows: int = 0

    def add_window(self, tokens: float, seconds: float, decay: float):
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.windows += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class WindowGuard:
    """Never slower than plain decoding, by A/B windows of whole decoding.

    Steps run in windows of `window` timed steps. In an "on" window the policy drafts as it sees
    fit; in an "off" window it runs no draft pass. Per batch-size bucket, each arm's emitted
    tokens and seconds are pooled over its windows, and the faster arm is kept; the slower one
    gets every `explore_every`-th window, so a verdict follows changes in load or context.

    Unlike RateGuard, which compares the rates of single drafted and plain steps, this compares
    what each arm achieves as a whole: an "on" window includes the steps where the policy chose
    not to draft and the draft passes that handed out nothing, and no step's rate is weighted by
    itself (pooled tokens over pooled time, not a mean of per-step rates).
    """

    def __init__(self, window: int = 32, min_windows: int = 2, explore_every: int = 8,
                 decay: float = 0.9, margin: float = 1.0):
        if window < 1 or min_windows < 1 or explore_every < 2 or not 0 < decay <= 1 \
                or margin <= 0:
            raise ValueError("window guard: window >= 1, min_windows >= 1, explore_every >= 2, "
                             "0 < decay <= 1 and margin > 0 are required")
        self.window = window
        self.min_windows = min_windows
        self.explore_every = explore_every
        self.decay = decay
        self.margin = margin  # drafting must reach margin x the plain rate to be kept
        self._arms: dict[tuple[int, bool], PooledRate] = {}
        self._since_explore: dict[int, int] = {}
        self.drafting = True  # the arm of the current window, or of the last one if none is open
        self._open = False
        self._steps = 0
        self._pending: dict[int, list[float]] = {}  # bucket -> [tokens, seconds] this window

    def arm(self, batch: int, drafting: bool) -> PooledRate:
        return self._arms.setdefault((batch_bucket(batch), drafting), PooledRate())

    def allows_drafting(self, batch: int) -> bool:
        """May the draft pass run this step? Opens a window (choosing its arm) if none is."""
        if not self._open:
            self.drafting = self._choose(batch)
            self._open = True
            self._steps = 0
        return self.drafting

    def _choose(self, batch: int) -> bool:
        on, off = self.arm(batch, True), self.arm(batch, False)
        if on.windows < self.min_windows or off.windows < self.min_windows:
            return on.windows <= off.windows  # measure both arms first, "on" first
        best = on.rate >= self.margin * off.rate
        bucket = batch_bucket(batch)
        self._since_explore[bucket] = self._since_explore.get(bucket, 0) + 1
        if self._since_explore[bucket] >= self.explore_every:
            self._since_explore[bucket] = 0
            return not best
        return best

    def record(self, batch: int, tokens: int, seconds: float):
        """One clean, timed decoding step of the current window."""
        if not self._open or batch < 1 or tokens < 1 or not seconds > 0:
            return
        pending = self._pending.setdefault(batch_bucket(batch), [0.0, 0.0])
        pending[0] += tokens
        pending[1] += seconds
        self._steps += 1
        if self._steps >= self.window:
            self._close()

    def _close(self):
        for bucket, (tokens, seconds) in self._pending.items():
            self._arms.setdefault((bucket, self.drafting), PooledRate()).add_window(
                tokens, seconds, self.decay)
        self._pending = {}
        self._open = False

    def speedups_by_bucket(self) -> dict[int, float]:
        """{bucket: measured on/off rate ratio} where both arms have windows."""
        ratios = {}
        for bucket in sorted({b for b, _ in self._arms}):
            on, off = self._arms.get((bucket, True)), self._arms.get((bucket, False))
            if on and off and on.windows and off.windows and off.rate > 0:
                ratios[bucket] = on.rate / off.rate
        return ratios
