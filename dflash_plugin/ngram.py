"""Prompt-lookup (n-gram) drafts next to the drafter's, chosen per request by the draft policy.

Engine-free: an adapter hands in each request's token history (prompt and output so far, up to
and including the token just sampled) and the drafter's calibrated acceptance chances, and gets
back, per request, which draft to verify and how much of it.

- `find_ngram_draft`: the longest suffix of the history of n tokens, n in [min_n, max_n], that
  occurred earlier in it, and the tokens that followed that occurrence (the latest one).
- `NgramCalibration`: the chance that the target accepts the k-th token of an n-gram draft
  given the ones before it were accepted, per matched length n, learnt online from
  verification like the drafter's confidence calibration.
- `NgramDrafts`: per step, before the draft pass, whether n-gram drafts alone (no draft pass
  to pay for) beat running the drafter; after the pass, per request, the draft with the larger
  expected gain. With a datastore of the target's answers (dflash_plugin.datastore) a request
  may also get the continuation retrieved for its last n-gram (`with_retrieved`), calibrated
  apart from the history's lookup. Lengths are then planned by the same cost model (draft_policy), and
  lookup-only steps are run only where recent ones paid for their time
  (lookup_gate.LookupGate).

Lossless either way: the target verifies whatever is drafted. n-gram drafts are deterministic,
so at T > 0 they may only be verified where the step carries no draft distribution (the adapter
checks that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from dflash_plugin.draft_policy import (
    CostModel,
    DraftPolicy,
    PolicyMode,
    cumulative_acceptance,
    plan_draft_lengths,
)
from dflash_plugin.datastore import DRAFT_MIN_NGRAM, NGRAM_SIZES, AnswerDatastore
from dflash_plugin.lookup_gate import LookupGate

# The lookup vLLM's n-gram method runs with under `dflash serve --speculative-algorithm NGRAM`.
NGRAM_MIN = 2
NGRAM_MAX = 4
# The n-gram lengths of retrieved drafts (the datastore's, from DRAFT_MIN_NGRAM on)
RETRIEVED_MIN = DRAFT_MIN_NGRAM
RETRIEVED_MAX = max(NGRAM_SIZES)
# Retrieved drafts are also calibrated by the share of the n-gram's occurrences that went on with
# the draft's first token, in these bands: offline, the first token was right 30% of the time at
# a share of 0.5 and 57% at 0.9 or more (docs/benchmarks.md, "drafts retrieved").
SHARE_EDGES = (0.7, 0.9)
SHARE_BANDS = len(SHARE_EDGES) + 1


@dataclass(frozen=True)
class NgramMatch:
    """A proposed continuation (`tokens`, 1-D) and the length of the n-gram it follows; from
    the request's own history, or `retrieved` from a datastore of the target's answers, where
    `share` of that n-gram's occurrences went on with the first token."""

    tokens: np.ndarray
    ngram: int
    retrieved: bool = False
    share: float = 1.0


def find_ngram_draft(history: np.ndarray, k: int, min_n: int = NGRAM_MIN,
                     max_n: int = NGRAM_MAX) -> NgramMatch | None:
    """The longest n-gram ending the history (n in [min_n, max_n]) that also ends earlier in it,
    and the k tokens that followed its latest earlier occurrence; None without a match.

    Where those tokens run into the end of the history, the copy goes on with the repeat it
    found (history "x a b a b" -> "a b a b ..."), as an overlapping copy would.
    """
    if not 1 <= min_n <= max_n:
        raise ValueError(f"n-gram lengths need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    tokens = np.asarray(history)
    size = tokens.shape[0]
    if k < 1 or size <= min_n:
        return None
    # Candidate end positions of an earlier occurrence: every earlier copy of the last token.
    ends = np.flatnonzero(tokens[:size - 1] == tokens[size - 1])
    if ends.size == 0:
        return None
    lengths = np.ones(ends.shape[0], dtype=np.int64)
    alive = np.ones(ends.shape[0], dtype=bool)
    for back in range(1, max_n):
        if back >= size:
            break
        reach = ends >= back
        same = np.zeros_like(alive)
        same[reach] = tokens[ends[reach] - back] == tokens[size - 1 - back]
        alive &= same
        if not alive.any():
            break
        lengths += alive
    best = int(lengths.max())
    if best < min_n:
        return None
    end = int(ends[np.flatnonzero(lengths == best)[-1]])
    start = end + 1
    period = size - start  # > 0: the occurrence ends before the history does
    return NgramMatch(tokens[start + np.arange(k) % period].copy(), best)


def lookup_continuation(history, length: int) -> list[int]:
    """The n-gram lookup's next `length` tokens for this history ([] where nothing matches)."""
    match = find_ngram_draft(np.asarray(history), length)
    return [] if match is None else match.tokens.tolist()


class NgramCalibration:
    """Per matched length n and draft position k: the running chance that the target accepts
    the k-th n-gram token given tokens 1..k-1 were accepted, from a prior, slowly forgetting.
    Retrieved drafts have rows of their own (after the lookup's), one per n-gram length and
    share band (SHARE_EDGES)."""

    def __init__(self, block: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX,
                 prior: float = 0.5, prior_weight: float = 4.0, decay: float = 0.999):
        self.min_n, self.max_n, self.block, self.decay = min_n, max_n, block, decay
        shape = (max_n - min_n + 1 + (RETRIEVED_MAX - RETRIEVED_MIN + 1) * SHARE_BANDS, block)
        self.tried = torch.full(shape, prior_weight, dtype=torch.float64)
        self.accepted = torch.full(shape, prior * prior_weight, dtype=torch.float64)
        self.num_drafts_seen = 0

    def _row(self, ngram: int, retrieved: bool = False, share: float = 1.0) -> int:
        if retrieved:
            n = min(max(ngram, RETRIEVED_MIN), RETRIEVED_MAX) - RETRIEVED_MIN
            band = sum(share >= edge for edge in SHARE_EDGES)  # per match, every step: no numpy
            return self.max_n - self.min_n + 1 + n * SHARE_BANDS + band
        return min(max(ngram, self.min_n), self.max_n) - self.min_n

    def gains(self, matches: Sequence[NgramMatch | None], limit: int) -> torch.Tensor:
        """[B, limit] chance that n-gram tokens 1..k are all accepted (0 past a proposal's end,
        and for requests without a match)."""
        # One cumulative product for every n-gram length, then numpy row copies: this runs
        # every step under load, where a torch call per request cost more than the lookup.
        cumulative = self._cumulative().numpy()
        gains = np.zeros((len(matches), limit))
        for i, match in enumerate(matches):
            if match is None:
                continue
            length = min(limit, match.tokens.shape[0], self.block)
            row = self._row(match.ngram, match.retrieved, match.share)
            gains[i, :length] = cumulative[row, :length]
        return torch.from_numpy(gains)

    def best_gains(self, limit: int) -> torch.Tensor:
        """[1, limit] the highest chance over n-gram lengths that tokens 1..k are all accepted
        (an upper bound on any match's gains)."""
        length = min(limit, self.block)
        best = torch.zeros(1, limit, dtype=torch.float64)
        best[0, :length] = self._cumulative()[:, :length].amax(0)
        return best

    def _cumulative(self) -> torch.Tensor:
        """[n-gram lengths, block] chance that tokens 1..k are all accepted."""
        return torch.cumprod(self.accepted / self.tried, dim=1)

    def observe(self, ngrams: Sequence[int], drafted: Sequence[int], accepted: Sequence[int],
                retrieved: Sequence[bool] | None = None, shares: Sequence[float] | None = None):
        """Verified n-gram drafts: the matched length, the tokens verified and how many of them
        the target accepted (tokens 1..a accepted, token a+1 rejected, later ones unknown), and
        which of them were retrieved (None: none) with their shares (None: all 1)."""
        if not ngrams:
            return
        self.tried *= self.decay
        self.accepted *= self.decay
        retrieved = retrieved or [False] * len(ngrams)
        shares = shares or [1.0] * len(ngrams)
        for ngram, length, ok, from_store, share in zip(ngrams, drafted, accepted, retrieved,
                                                        shares):
            seen = min(ok + 1, length, self.block)
            row = self._row(ngram, from_store, share)
            self.tried[row, :seen] += 1.0
            self.accepted[row, :min(ok, seen)] += 1.0
        self.num_drafts_seen += len(ngrams)


def draft_value(gains: torch.Tensor, price: float) -> torch.Tensor:
    """[B, K] cumulative acceptance chances -> [B] the most expected accepted tokens net of
    `price` per verified token that a prefix of the draft brings (0: verify none)."""
    if gains.shape[-1] == 0:
        return gains.new_zeros(gains.shape[:-1])
    best = torch.cumsum(gains - price, dim=-1).amax(dim=-1)
    return best.clamp_min(0.0)


def token_price(costs: CostModel, batch: int) -> float:
    """What one more verified token must bring to raise the step's rate, at about plain
    decoding's rate (tokens per unit time)."""
    return costs.verify_per_token * batch / costs.verify_time(batch)


def expected_rate(gains: torch.Tensor, lengths: Sequence[int], costs: CostModel,
                  draft_pass: bool) -> float:
    """Expected tokens per unit time of a step verifying `lengths` drafts per request."""
    batch = gains.shape[0]
    expected = float(batch) + sum(float(gains[i, :n].sum()) for i, n in enumerate(lengths))
    step_time = costs.verify_time(batch + sum(lengths))
    if draft_pass:
        step_time += costs.draft_time(batch)
    return expected / step_time


@dataclass
class NgramCounts:
    """n-gram drafts over a window of steps (logged with the drafter's counts, then reset)."""

    steps_without_draft_pass: int = 0  # steps whose drafts all came from the lookup
    drafts_handed_out: int = 0  # requests that got an n-gram draft verified
    tokens_handed_out: int = 0
    tokens_accepted: int = 0
    retrieved_handed_out: int = 0  # of drafts_handed_out, those retrieved from the datastore
    retrieved_tokens_accepted: int = 0

    def summary(self) -> str:
        return (f"n-gram: {self.drafts_handed_out} drafts ({self.tokens_handed_out} tokens, "
                f"{self.tokens_accepted} accepted; {self.retrieved_handed_out} drafts retrieved, "
                f"{self.retrieved_tokens_accepted} of their tokens accepted), "
                f"{self.steps_without_draft_pass} steps without a draft pass")


class NgramDrafts:
    """The n-gram side of one drafter's policy: the lookup, its calibration and the choices.
    The policy itself is passed in with each choice (an adapter may replace it)."""

    def __init__(self, block: int, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX,
                 explore_every: int = 32, datastore: AnswerDatastore | None = None):
        self.min_n, self.max_n = min_n, max_n
        self.datastore = datastore
        self.calibration = NgramCalibration(block, min_n, max_n)
        self.counts = NgramCounts()
        # Every this many steps whose matches all lost to the drafter, a matched request takes
        # its n-gram draft anyway, so that the calibration keeps learning what lookup is worth.
        self.explore_every = explore_every
        self.steps_unused = 0
        self.gate = LookupGate()  # what lookup-only steps brought, per band of batch sizes
        self._free: tuple[CostModel | None, CostModel | None] = (None, None)
        # could_pay's answers per (batch, limit), for these costs and drafts seen
        self._could_pay: dict[tuple[int, int], bool] = {}
        self._could_pay_key: tuple[CostModel, int] | None = None

    @staticmethod
    def active(policy: DraftPolicy) -> bool:
        """Only the adaptive policy chooses drafts (off drafts nothing, full the whole block)."""
        return policy.mode is PolicyMode.ADAPTIVE

    def find(self, histories: Sequence[np.ndarray | None], k: int) -> list[NgramMatch | None]:
        """One lookup per request (None: no history, e.g. a prefill chunk, or no match)."""
        return [None if h is None else find_ngram_draft(h, k, self.min_n, self.max_n)
                for h in histories]

    def with_retrieved(self, matches: Sequence[NgramMatch | None], tails: np.ndarray,
                       sizes: np.ndarray, costs: CostModel,
                       limit: int) -> list[NgramMatch | None]:
        """`matches` (the history's lookup, per request) with the datastore's drafts where
        lookup found none or where the retrieved draft is worth more by the calibration.
        `tails` [B, W] / `sizes` [B]: each history's last tokens (AnswerDatastore.drafts)."""
        if self.datastore is None or limit < 1:
            return list(matches)
        found = self.datastore.drafts(tails, sizes, limit)
        retrieved = [None if m is None else NgramMatch(m.tokens, m.ngram, True, m.share)
                     for m in found]
        both = [i for i, (a, b) in enumerate(zip(matches, retrieved)) if a is not None
                and b is not None]
        better = set()
        if both:
            price = token_price(costs, len(matches))
            own = draft_value(self.calibration.gains([matches[i] for i in both], limit), price)
            other = draft_value(self.calibration.gains([retrieved[i] for i in both], limit),
                                price)
            better = {i for i, wins in zip(both, (other > own).tolist()) if wins}
        return [retrieved[i] if retrieved[i] is not None and (match is None or i in better)
                else match for i, match in enumerate(matches)]

    def could_pay(self, costs: CostModel, batch: int, limit: int) -> bool:
        """Whether lookup-only drafts could pay at this batch at all: planned for the best
        case, every request matching `limit` tokens at the best calibrated chances of any
        n-gram length. Fewer or weaker matches only lower the best rate, so False means that
        a step without a draft pass need not look up n-grams."""
        seen = self.calibration.num_drafts_seen
        if (self._could_pay_key is None or self._could_pay_key[0] is not costs
                or self._could_pay_key[1] != seen):
            self._could_pay_key, self._could_pay = (costs, seen), {}
        if (batch, limit) not in self._could_pay:
            best = self.calibration.best_gains(limit)
            lengths = plan_draft_lengths(best.expand(batch, -1), self._without_draft_pass(costs))
            self._could_pay[(batch, limit)] = any(lengths)
        return self._could_pay[(batch, limit)]

    def plan_without_draft_pass(self, policy: DraftPolicy, matches: Sequence[NgramMatch | None],
                                limit: int, drafter_runs: bool) -> list[int] | None:
        """Before the draft pass: n-gram draft lengths for a step without one, when that beats
        what running the drafter is expected to bring (`drafter_runs`: the policy wants the
        pass); None to leave the step to the drafter (or to nobody)."""
        if not self.active(policy) or not any(m is not None for m in matches):
            return None
        batch = len(matches)
        costs = policy.costs
        lookup = self.calibration.gains(matches, limit)
        free = self._without_draft_pass(costs)
        lengths = plan_draft_lengths(lookup, free)
        if not any(lengths):
            return None
        if drafter_runs:
            # The drafter as it has done lately (its running curve), or the lookup where that
            # is worth more: the best the step can expect with a draft pass.
            curve = policy.curve[:limit].expand(batch, -1)
            mixed = self._mix(costs, curve, lookup, batch)
            with_pass = plan_draft_lengths(mixed, costs)
            if any(with_pass) and (expected_rate(mixed, with_pass, costs, True)
                                   > expected_rate(lookup, lengths, free, False)):
                return None
        if not self.gate.allows(costs, batch, sum(lengths)) or self.gate.wants_reference(batch):
            return None
        self.counts.steps_without_draft_pass += 1
        return lengths

    def _without_draft_pass(self, costs: CostModel) -> CostModel:
        """`costs` with the draft pass free (kept while the policy's costs stay the same)."""
        if self._free[0] is not costs:
            self._free = (costs, replace(costs, draft_fixed=0.0, draft_per_request=0.0))
        return self._free[1]

    def choose(self, policy: DraftPolicy, drafter_gains: torch.Tensor,
               matches: Sequence[NgramMatch | None]) -> tuple[torch.Tensor, list[bool]]:
        """After the draft pass: per request, the drafter's gains [B, K] or the lookup's,
        whichever is worth more; returns the mixed gains and which rows took the lookup."""
        batch, limit = drafter_gains.shape
        if not self.active(policy) or not any(m is not None for m in matches):
            return drafter_gains, [False] * batch
        lookup = self.calibration.gains(matches, limit)
        take = self._lookup_rows(policy.costs, drafter_gains, lookup, batch)
        if not any(take):
            self.steps_unused += 1
            if self.steps_unused >= self.explore_every:
                take = [m is not None for m in matches]
        if any(take):
            self.steps_unused = 0
        mixed = torch.where(torch.tensor(take).unsqueeze(-1), lookup, drafter_gains)
        return mixed, take

    @staticmethod
    def _lookup_rows(costs, drafter_gains, lookup, batch) -> list[bool]:
        price = token_price(costs, batch)
        return (draft_value(lookup, price) > draft_value(drafter_gains, price)).tolist()

    def _mix(self, costs, drafter_gains, lookup, batch) -> torch.Tensor:
        take = torch.tensor(self._lookup_rows(costs, drafter_gains, lookup, batch)).unsqueeze(-1)
        return torch.where(take, lookup, drafter_gains)

    def handed_out(self, lengths: Sequence[int], retrieved: Sequence[bool] | None = None):
        used = [n for n in lengths if n]
        self.counts.drafts_handed_out += len(used)
        self.counts.tokens_handed_out += sum(used)
        if retrieved:
            self.counts.retrieved_handed_out += sum(1 for n, r in zip(lengths, retrieved)
                                                    if n and r)

    def observe(self, ngrams: Sequence[int], drafted: Sequence[int], accepted: Sequence[int],
                retrieved: Sequence[bool] | None = None, shares: Sequence[float] | None = None):
        self.counts.tokens_accepted += sum(accepted)
        if retrieved:
            self.counts.retrieved_tokens_accepted += sum(a for a, r in zip(accepted, retrieved)
                                                         if r)
        self.calibration.observe(ngrams, drafted, accepted, retrieved, shares)
