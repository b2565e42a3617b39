"""Load-aware drafting inside vLLM: turns the proposer's tensors into the inputs of
`dflash_plugin.draft_policy` and its answer back into per-request draft lists.

One `Drafting` object lives on each drafter built by this plugin (`DFlashVllmDrafter`). It also
times the real steps around the propose hook (P1) for its `StepClock`, and every so many
decoding steps gives the policy the costs fitted to them (the same on every tensor-parallel
rank: rank 0's).

Environment (read in the worker when the drafter is built; declared in dflash_plugin.switches):
DFLASH_DRAFT_POLICY, DFLASH_COST_MODEL, DFLASH_DRAFT_VOCAB, DFLASH_DEFER_CONTEXT,
DFLASH_SAMPLER_SHORTCUT, DFLASH_STATS_EVERY (and DFLASH_NGRAM_DRAFTS, in vllm_ext.ngram_drafts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from dflash_plugin.cpu_features import native_bf16
from dflash_plugin.draft_policy import (
    CostModel,
    DraftPolicy,
    PolicyMode,
    cpu_compute,
    parse_cost_overrides,
    vllm_cpu_costs,
    vllm_cpu_preset,
)
from dflash_plugin.measured_costs import cuda_costs
from dflash_plugin.ngram import NGRAM_MAX, NGRAM_MIN, NgramDrafts, NgramMatch
from dflash_plugin.step_clock import COST_TERMS, MeasuredCosts, StepClock
from dflash_plugin.switches import SwitchError, read
from vllm_ext.context_store import DeferredContext
from vllm_ext.ngram_drafts import request_ids, step_matches, step_tails

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler


def policy_mode_from_env() -> PolicyMode:
    return PolicyMode(read("DFLASH_DRAFT_POLICY"))


def cost_model_from_env(is_cpu: bool, num_draft_layers: int | None = None,
                        draft_positions: int | None = None,
                        dtype: torch.dtype | None = None) -> CostModel:
    """The platform's preset, then DFLASH_COST_MODEL. On CPUs the preset follows how the target
    computes (draft_policy.vllm_cpu_preset: float32, bf16 in software or native) given its
    `dtype` and the draft pass's `draft_positions`; without them, the native-bf16 preset scaled
    to the drafter's depth."""
    if not is_cpu:
        base = cuda_costs(num_draft_layers)
    elif dtype is None or draft_positions is None:
        base = vllm_cpu_costs(num_draft_layers)
    else:
        base = vllm_cpu_preset(num_draft_layers, draft_positions, dtype, native_bf16())
    return replace(base, **_cost_overrides())


def cost_overrides_from_env() -> frozenset[str]:
    """The cost fields DFLASH_COST_MODEL sets: measured costs keep the user's values there."""
    return frozenset(_cost_overrides())


def _cost_overrides() -> dict[str, float]:
    try:
        return parse_cost_overrides(read("DFLASH_COST_MODEL") or "")
    except ValueError as err:
        raise SwitchError(f"DFLASH_COST_MODEL: {err}") from None


def step_clock_for(policy: DraftPolicy, num_speculative_tokens: int) -> StepClock | None:
    """The clock that measures this drafter's step costs, starting from the policy's preset
    (None where the policy reads no costs: modes full and off)."""
    if policy.mode is not PolicyMode.ADAPTIVE:
        return None
    return StepClock(policy.costs, num_speculative_tokens + 1, pinned=cost_overrides_from_env())


def agree_across_ranks(measured: MeasuredCosts, group=None) -> MeasuredCosts:
    """Rank 0's measured costs on every rank of the tensor-parallel `group` (default: vLLM's),
    so that all ranks make the same draft decisions. Every rank must call it at the same step;
    a single rank (or no group) keeps its own."""
    if group is None:
        group = _tensor_parallel_group()
    if group is None or group.world_size <= 1:
        return measured
    return group.broadcast_object(measured, src=0)


def own_times() -> bool:
    """Whether this worker may act on its own wall times: not on one of several tensor-parallel
    ranks, whose draft decisions must agree (they use the agreed cost model instead)."""
    group = _tensor_parallel_group()
    return group is None or group.world_size <= 1


def _tensor_parallel_group():
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group()
    except (ImportError, AssertionError):  # no vLLM, or no group set up (tests)
        return None


def _settle(tensor: torch.Tensor | None):
    """Wait for the device's queued work (a GPU runs asynchronously; a CPU's is already done),
    so a time stamp taken next covers it."""
    if tensor is not None and tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)


def _moved(before: MeasuredCosts, after: MeasuredCosts, rel: float = 0.1) -> bool:
    """Whether a line's source changed or a cost term moved by more than `rel` (relative)."""
    if (before.verify, before.draft) != (after.verify, after.draft):
        return True
    return any(abs(getattr(after.costs, name) - getattr(before.costs, name))
               > rel * max(getattr(before.costs, name), 1e-3) for name in COST_TERMS)


def costs_in_software_bf16(is_cpu: bool, dtype: torch.dtype) -> bool:
    """A 16-bit target on a CPU known to lack native bf16 (the preset that never drafts)."""
    return is_cpu and cpu_compute(dtype, native_bf16()) == "software-bf16"


def defer_context_from_env() -> bool:
    return read("DFLASH_DEFER_CONTEXT")


def sampler_shortcut_from_env() -> bool:
    return read("DFLASH_SAMPLER_SHORTCUT")


def draft_vocab_from_env() -> bool:
    """True: restrict the draft head to the checkpoint's training vocabulary, if it has one."""
    return read("DFLASH_DRAFT_VOCAB") == "auto"


def stats_every_from_env() -> int:
    return read("DFLASH_STATS_EVERY")


@dataclass(frozen=True)
class LookupDraft:
    """A pending draft that came from prompt lookup (or was `retrieved` from the datastore,
    with its share), and the n-gram length it matched."""

    ngram: int
    retrieved: bool = False
    share: float = 1.0


@dataclass
class StepCounts:
    """What the policy did over a window of steps (logged, then reset)."""

    steps: int = 0
    draft_passes: int = 0
    empty_passes: int = 0  # the draft pass ran but no request got a draft verified
    drafts_handed_out: int = 0
    drafts_accepted: int = 0
    plain_steps: int = 0  # steps that skipped vLLM's drafter-input preparation (P8)

    def summary(self) -> str:
        return (f"{self.steps} steps ({self.plain_steps} without drafter inputs): "
                f"{self.draft_passes} draft passes ({self.empty_passes} "
                f"handed out nothing), {self.drafts_handed_out} drafts verified, "
                f"{self.drafts_accepted} accepted")


class Drafting:
    """Per-drafter state between steps: the policy, the confidences of the last draft pass, and
    the drafts handed to the scheduler (to learn from their verification next step)."""

    now: Callable[[], float] = staticmethod(time.perf_counter)  # seconds (tests replace it)

    def __init__(self, policy: DraftPolicy, stats_every: int = 0,
                 deferred_context: DeferredContext | None = None,
                 ngram: NgramDrafts | None = None, clock: StepClock | None = None):
        self.policy = policy
        # Real step times -> the policy's costs (None: the preset stays). `_left`: when the
        # last propose call returned; `_step`: this step's (batch, longest query, device
        # tensor) while its propose call runs.
        self.clock = clock
        self._left: float | None = None
        self._step: tuple[int, int, torch.Tensor | None] | None = None
        # The target step this propose call receives, for the lookup gate: (batch, tokens it
        # processed, ms); None when not timed. Only a worker on its own times
        # them (own_times; asked at the first timed step, once the engine's groups exist).
        self._timed: tuple[int, int, float] | None = None
        # A lookup-gate booking held until the proposal that made it ends (timing_step).
        self._booking: tuple | None = None
        self._pass_ms = 0.0  # the draft pass inside this proposal
        self._own_times: bool | None = None
        self.measured: MeasuredCosts | None = None  # the last refit's (the policy's costs)
        self._logged: MeasuredCosts | None = None  # the measured costs last logged at INFO
        # Prompt-lookup drafts (DFLASH_NGRAM_DRAFTS; None: off) and this step's token sources,
        # recorded by P6 just before the propose hook reads them (vllm_ext.ngram_drafts).
        self.ngram = ngram
        # The drafter reads the lookup's continuation in its mask slots (set by the model from
        # its config's dflash_config.lookup_hints; written by P1, A6).
        self.lookup_hints = False
        self.hints: list[NgramMatch | None] = []  # this step's, set by `lookup`
        self.step_tokens = None
        # P8 (vllm_ext.plain_steps): the runner-level hook times the step itself
        # (`runner_timed`, while it runs) and may hand P1 the step's plan (`planned`).
        self.runner_timed = False
        self.planned = None
        # Context writes held back while no draft pass runs (None: write every step).
        self.deferred_context = deferred_context
        self.stats_every = stats_every  # log StepCounts every this many steps (0: never)
        self.counts = StepCounts()
        self.confidence: torch.Tensor | None = None  # [rows] from the last compute_logits
        # (bonus token, *drafts) of each request drafted last step -> the drafts' confidences
        # (None where the policy reads none: they are still counted as accepted or not).
        # Rows move between steps; the verified tokens themselves identify the request.
        self._pending: dict[tuple[int, ...], torch.Tensor | LookupDraft | None] = {}
        self._collecting = False  # inside the hooked draft pass
        self._last_pass: tuple[int, int] | None = None  # (batch, drafts verified) to book
        # Per request id: False for a request whose drafter context is not written, because it
        # arrived while draft passes at its batch size were losing (it keeps lookup drafts).
        self._has_context: dict[str, bool] = {}

    @contextmanager
    def timing_step(self, cad, device_tensor: torch.Tensor | None = None):
        """Around P1's propose call: the time since the last call returned is the target step
        whose tokens this call receives (`cad`, vLLM's CommonAttentionMetadata); its
        `device_tensor` (the target's output) shows which device's work to wait for."""
        if self.clock is None:
            yield
            return
        _settle(device_tensor)
        entered = self.now()
        batch = cad.batch_size()
        starts = cad.query_start_loc_cpu[:batch + 1]
        max_query = int((starts[1:] - starts[:-1]).max()) if batch else 0
        self._step = (batch, max_query, device_tensor)
        if self._left is not None:
            ms = (entered - self._left) * 1e3
            if self._own_times is None:
                self._own_times = own_times()
            if self._own_times and self.clock.is_decode(max_query):
                self._timed = (batch, int(cad.num_actual_tokens), ms)
            if self.clock.target_step(int(cad.num_actual_tokens), batch, max_query, ms):
                self._refit()
        self._pass_ms = 0.0
        try:
            yield
        finally:
            left = self.now()
            if self._booking is not None:
                # The lookup gate's steps also pay their own proposal (less a draft pass,
                # which is the next step's): after verified drafts it is several times longer.
                book, args, ms = self._booking
                self._booking = None
                book(*args, ms + (left - entered) * 1e3 - self._pass_ms)
            self._step = self._timed = None
            self._left = left

    @contextmanager
    def timing_draft_pass(self):
        """Around the draft pass (vLLM's original propose) inside `timing_step`."""
        if self.clock is None or self._step is None:
            yield
            return
        batch, max_query, device_tensor = self._step
        started = self.now()
        yield
        _settle(device_tensor)
        self._pass_ms = (self.now() - started) * 1e3
        self.clock.draft_pass(batch, max_query, self._pass_ms)

    def _refit(self):
        measured = self.measured = agree_across_ranks(self.clock.fit())
        self.policy.set_costs(measured.costs)
        # One INFO line for the first refit and whenever the costs moved; the rest at DEBUG.
        moved = self._logged is None or _moved(self._logged, measured)
        logger.log(logging.INFO if moved else logging.DEBUG,
                   "dflash plugin: step costs measured over %d decoding steps: %s",
                   measured.steps, measured.summary())
        if moved:
            self._logged = measured

    @property
    def wants_confidence(self) -> bool:
        """Only inside the hooked draft pass, and only if the policy learns from them."""
        return self._collecting and self.policy.mode is PolicyMode.ADAPTIVE

    @contextmanager
    def collecting_confidence(self):
        self._collecting = True
        try:
            yield
        finally:
            self._collecting = False

    def learn(self, target_token_ids: torch.Tensor, query_start_loc_cpu: torch.Tensor,
              num_rejected: torch.Tensor | None):
        """Feed last step's verification results to the policy.

        target_token_ids [T]: this step's target input (per request: bonus token, then the
        drafts it verified); num_rejected [B]: how many of those drafts were rejected.
        """
        self._learn(target_token_ids, query_start_loc_cpu, num_rejected)
        self._count_step()

    def flush_context(self, drafter):
        """Do the held context writes now (before a draft pass, or when the queue is full)."""
        self.deferred_context.flush(drafter)

    def _learn(self, target_token_ids, query_start_loc_cpu, num_rejected):
        starts = query_start_loc_cpu.tolist()
        rejected = num_rejected.tolist() if num_rejected is not None else None
        pending, self._pending = self._pending, {}
        last_pass, self._last_pass = self._last_pass, None
        if not pending and last_pass is None:
            self._book_draft_free_step(len(starts) - 1, starts[-1])
        if not pending or rejected is None:
            if last_pass is not None:
                self.policy.pass_outcome(*last_pass, 0)
            return
        ids = target_token_ids.tolist()
        confidences, accepted = [], []
        lookups: tuple[list[int], list[int], list[int], list[bool], list[float]] = (
            [], [], [], [], [])
        taken = 0  # accepted drafts of all requests (the pass's outcome)
        for i, num_rej in enumerate(rejected):
            key = tuple(ids[starts[i]:starts[i + 1]])
            if key not in pending:
                continue
            taken += len(key) - 1 - num_rej
            if isinstance(pending[key], LookupDraft):
                draft = pending[key]
                for column, value in zip(lookups, (draft.ngram, len(key) - 1,
                                                   len(key) - 1 - num_rej, draft.retrieved,
                                                   draft.share)):
                    column.append(value)
            elif pending[key] is not None:
                confidences.append(pending[key])
                accepted.append(len(key) - 1 - num_rej)
        self.counts.drafts_accepted += taken
        if last_pass is not None:
            self.policy.pass_outcome(*last_pass, taken)
        if confidences:
            self.policy.observe(confidences, accepted)
        if lookups[0] and self.ngram is not None:
            self.ngram.observe(*lookups)
            if last_pass is None:
                self._book_lookup_step(len(rejected), starts[-1], sum(lookups[1]),
                                       sum(lookups[2]))

    def _step_ms(self, batch: int, num_tokens: int) -> float | None:
        """The measured time of the step with this shape that just ran (None: not timed)."""
        timed = self._timed
        return timed[2] if timed is not None and timed[:2] == (batch, num_tokens) else None

    def _book_draft_free_step(self, batch: int, num_tokens: int):
        """The step just verified no drafts: its time is the lookup gate's reference."""
        ms = self._step_ms(batch, num_tokens) if num_tokens == batch else None
        if self.ngram is not None and ms is not None:
            self._booking = (self.ngram.gate.draft_free_step, (batch,), ms)

    def _book_lookup_step(self, batch: int, num_tokens: int, verified: int, accepted: int):
        """The step just verified lookup drafts only (no draft pass ran for it). A step whose
        tokens do not add up (a prefill chunk rode along) says nothing and is not booked."""
        if num_tokens != batch + verified:
            return
        ms = self._step_ms(batch, num_tokens)
        args = (self.policy.costs, batch, verified, accepted)
        if ms is None:
            self.ngram.gate.lookup_step(*args)
        else:
            self._booking = (self.ngram.gate.lookup_step, args, ms)

    def _count_step(self):
        self.counts.steps += 1
        if self.stats_every and self.counts.steps >= self.stats_every:
            logger.info("dflash plugin: %s; %s", self.counts.summary(),
                        self.policy.gate.summary())
            self.counts = StepCounts()
            if self.ngram is not None:
                logger.info("dflash plugin: %s; %s", self.ngram.counts.summary(),
                            self.ngram.gate.summary())
                self.ngram.counts = type(self.ngram.counts)()

    def rows_without_context(self, batch: int) -> list[int]:
        """This step's rows whose requests have no drafter context. A request seen for the first
        time gets none when no draft pass is to be expected at this batch size
        (`DraftPolicy.passes_closed`): its context would cost every step and likely never be
        read. A request that arrives alone keeps it (its writes are cheap, and without it a
        closed band 1 could never be explored again). In a batch where not even the prior
        drafter would pay for a pass (`DraftPolicy.passes_hopeless`) every request loses it.
        Reads P6's record (request ids of the input batch); without one, every request keeps
        its context."""
        if self.deferred_context is None or self.policy.mode is not PolicyMode.ADAPTIVE:
            return []
        req_ids = request_ids(self.step_tokens, batch)
        if req_ids is None:
            return []
        known = self._has_context
        if batch > 1 and self.policy.passes_hopeless(batch):
            # so large a batch drafts nothing whatever the drafter learns: nobody keeps context
            for req_id in req_ids:
                known[req_id] = False
        rows = []
        for row, req_id in enumerate(req_ids):
            if req_id not in known:
                known[req_id] = batch <= 1 or not self.policy.passes_closed(batch)
            if not known[req_id]:
                rows.append(row)
        if len(known) > 4 * batch + 64:  # forget finished requests
            self._has_context = {r: known[r] for r in req_ids}
        return rows

    def lookup(self, batch: int, k: int, no_drafts: Sequence[int] = (),
               draft_pass: bool = True) -> list[NgramMatch | None]:
        """This step's prompt-lookup proposals of up to k tokens per request, from P6's record
        (empty when lookup is off or the policy does not choose lengths, and without a
        `draft_pass` when the lookup gate refuses lookup-only drafts at this batch). For a
        drafter that reads hints, the same proposals are kept in `hints` whatever the policy."""
        record, self.step_tokens = self.step_tokens, None
        self.hints = []
        hybrid = self.ngram is not None and self.ngram.active(self.policy)
        # Without a draft pass (hints only serve one) only lookup-only drafts could be used:
        # none where they could not pay at this batch or their gate is sure to refuse them
        # (LookupGate.waits counts such a step towards the band's next try).
        if not draft_pass and not (hybrid
                                   and self.ngram.could_pay(self.policy.costs, batch,
                                                            self.policy.block)
                                   and not self.ngram.gate.waits(self.policy.costs, batch)):
            return []
        if k <= 0 or not (hybrid or self.lookup_hints):
            return []
        same = hybrid and (self.ngram.min_n, self.ngram.max_n) == (NGRAM_MIN, NGRAM_MAX)
        matches = (step_matches(record, batch, k, self.ngram.min_n, self.ngram.max_n)
                   if hybrid else [])
        hints = []  # the lookup the reference path and training use (the core's lengths)
        if self.lookup_hints:
            hints = list(matches) if same else step_matches(record, batch, k)
        if hybrid and self.ngram.datastore is not None:
            tails, sizes = step_tails(record, batch, self.ngram.datastore.max_ngram)
            matches = self.ngram.with_retrieved(matches, tails, sizes, self.policy.costs, k)
        for row in no_drafts:
            for found in (matches, hints):
                if row < len(found):
                    found[row] = None
        if self.lookup_hints:
            self.hints = hints
        return matches

    def lookup_only(self, matches: Sequence[NgramMatch | None], limit: int,
                    draft_pass: bool) -> list[int] | None:
        """Draft lengths for a step that verifies lookup drafts only and skips the draft pass
        (`draft_pass`: the policy wants one), or None."""
        if not matches:
            return None
        return self.ngram.plan_without_draft_pass(self.policy, matches, limit, draft_pass)

    def lookup_drafts(self, batch: int, matches: Sequence[NgramMatch | None],
                      lengths: Sequence[int] | None,
                      next_token_ids: torch.Tensor) -> list[list[int]]:
        """The drafts of a step without a draft pass: lookup drafts where `lengths` says so."""
        if lengths is None:
            return [[] for _ in range(batch)]
        bonus = next_token_ids.tolist()
        selected = [self._hand_out_lookup(bonus[i], matches[i], n) for i, n in enumerate(lengths)]
        self.ngram.handed_out([len(row) for row in selected],
                              [m is not None and m.retrieved for m in matches])
        self.counts.drafts_handed_out += sum(len(row) for row in selected)
        return selected

    def _hand_out_lookup(self, bonus: int, match: NgramMatch | None, length: int) -> list[int]:
        if match is None or not length:
            return []
        row = match.tokens[:length].tolist()
        self._pending[(bonus, *row)] = LookupDraft(match.ngram, match.retrieved, match.share)
        return row

    def select(self, drafts: torch.Tensor, next_token_ids: torch.Tensor,
               no_drafts: Sequence[int] = (),
               matches: Sequence[NgramMatch | None] | None = None,
               no_drafter: Sequence[int] = ()) -> list[list[int]]:
        """drafts [B, K] -> each request's drafts to verify (a prefix, possibly empty); the rows
        in `no_drafts` get none (vllm_ext.plain_sampling), those in `no_drafter` (no drafter
        context) none of the drafter's. With lookup `matches`, a request whose lookup draft is
        worth more than the drafter's gets that one instead."""
        batch, block = drafts.shape
        confidence, self.confidence = self.confidence, None
        if confidence is not None and confidence.numel() == batch * block:
            confidence = confidence.view(batch, block)
        else:
            confidence = None
        from_lookup = [False] * batch
        no_drafter = [row for row in no_drafter if row < batch]
        if (matches and confidence is not None and self.ngram is not None
                and self.ngram.active(self.policy)):
            gains = self.policy.drafter_gains(confidence)
            gains[no_drafter] = 0.0  # no context: the drafter's guesses are worth nothing
            gains, from_lookup = self.ngram.choose(self.policy, gains, matches)
            lengths = self.policy.plan(gains)
        else:
            lengths = list(self.policy.choose(batch, confidence, block))
        for row in (*no_drafts, *no_drafter):
            if row < batch and not (from_lookup[row] and row not in no_drafts):
                lengths[row] = 0
        rows = drafts.tolist()
        bonus = next_token_ids.tolist()
        selected = []
        for i, (row, length) in enumerate(zip(rows, lengths)):
            if from_lookup[i]:
                selected.append(self._hand_out_lookup(bonus[i], matches[i], length))
                lengths[i] = len(selected[-1])
                continue
            selected.append(row[:length])
            if length:
                self._pending[(bonus[i], *row[:length])] = (
                    confidence[i, :length] if confidence is not None else None)
        if any(from_lookup):
            self.ngram.handed_out(
                [n for n, lookup in zip(lengths, from_lookup) if lookup],
                [matches[i].retrieved for i, lookup in enumerate(from_lookup) if lookup])
        self.counts.draft_passes += 1
        self.counts.empty_passes += not any(lengths)
        self.counts.drafts_handed_out += sum(lengths)
        if any(lengths):  # booked when verification reports back (learn)
            self._last_pass = (batch, sum(lengths))
        else:
            self.policy.pass_outcome(batch, 0, 0)
        return selected

    def skipped(self):
        """No draft pass ran this step."""
        self.confidence = None
