"""Requests without drafter context (engine-free): which requests lose it, what they are still
offered, and which context tokens are written (the engine test is in test_engine.py)."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch

from dflash_plugin.draft_policy import (
    DraftPolicy,
    PolicyMode,
    cumulative_acceptance,
    vllm_cpu_fp32_costs,
)
from dflash_plugin.ngram import NgramDrafts
from vllm_ext import patches
from vllm_ext.context_store import DeferredContext
from vllm_ext.drafting import Drafting, LookupDraft

BLOCK = 6
PROMPT = [1, 2, 7, 8, 9, 10, 11, 12, 13, 3]  # the answer copies it: ... 8, 9 -> 10, 11, ...


def drafting(deferred=True, lookup=False) -> Drafting:
    # a pass cheap enough that the optimistic prior pays for one at up to 3 requests
    costs = replace(vllm_cpu_fp32_costs(BLOCK + 1), draft_per_request=0.05)
    policy = DraftPolicy(PolicyMode.ADAPTIVE, costs, BLOCK)
    ngram = None
    if lookup:
        ngram = NgramDrafts(BLOCK)
        for _ in range(100):  # lookup drafts that always pass
            ngram.calibration.observe([2], [BLOCK], [BLOCK])
    return Drafting(policy, deferred_context=DeferredContext() if deferred else None,
                    ngram=ngram)


def record(d, req_ids, rows=None):
    rows = rows or [[5, 6]] * len(req_ids)
    token_ids = np.zeros((len(req_ids), 32), dtype=np.int32)
    for i, row in enumerate(rows):
        token_ids[i, :len(row)] = row
    batch = SimpleNamespace(req_ids=list(req_ids), token_ids_cpu=token_ids, vocab_size=100,
                            num_tokens_no_spec=np.array([len(r) for r in rows]))
    sampled = torch.tensor([[8, -1]] * len(req_ids), dtype=torch.int32)
    d.step_tokens = (batch, sampled, torch.zeros(len(req_ids), dtype=torch.bool))


def close_band_of(d, batch):
    for _ in range(3):
        d.policy.pass_outcome(batch, 0, 0)


def test_requests_arriving_while_passes_are_closed_get_no_context_for_good():
    d = drafting()
    record(d, ["a", "b"])
    assert d.rows_without_context(2) == []  # nothing closed yet: both keep context
    close_band_of(d, 2)
    record(d, ["a", "b", "c"])
    assert d.rows_without_context(3) == [2]  # only the newcomer
    close_band_of(d, 1)  # even lone requests lose now; earlier decisions stand
    record(d, ["c", "a"])
    assert d.rows_without_context(2) == [0]
    record(d, ["a", "d"])
    assert d.rows_without_context(2) == [1]
    record(d, ["e"])  # alone: it keeps its context, so that band 1 can still be explored
    assert d.rows_without_context(1) == []


def test_no_context_where_even_an_optimistic_drafter_would_not_pay():
    d = drafting()
    d.policy.set_costs(replace(d.policy.costs, draft_fixed=50.0))  # dearer than 50 steps
    record(d, ["a", "b"])
    assert d.rows_without_context(2) == [0, 1]
    assert d.policy.passes_closed(2) and not d.policy.should_draft(2)
    d.policy.mode = PolicyMode.OFF
    assert d.policy.passes_closed(2)
    d.policy.mode = PolicyMode.FULL
    assert not d.policy.passes_closed(2)


def test_no_context_where_the_drafter_as_it_accepts_lately_would_not_pay():
    """The optimistic prior would pay for a pass at two requests, the learned curve not: only
    an exploring pass would run there, so newcomers get no context (and their steps can be
    plain, P8); once the drafter accepts more, newcomers keep it again."""
    d = drafting()
    assert d.policy._drafts_pay_off(2, prior=True)
    d.policy.curve = cumulative_acceptance(torch.full((BLOCK,), 0.02))
    d.policy._worth_drafting.clear()
    record(d, ["a", "b"])
    assert d.rows_without_context(2) == [0, 1] and d.policy.passes_closed(2)
    d.policy.curve = d.policy.prior_curve.clone()
    d.policy._worth_drafting.clear()
    record(d, ["a", "c"])
    assert d.rows_without_context(2) == [0]  # earlier decisions stand; "c" keeps it


def test_a_batch_too_large_for_any_pass_drops_everyones_context():
    d = drafting()
    assert d.policy._drafts_pay_off(2, prior=True)
    assert not d.policy._drafts_pay_off(64, prior=True) and d.policy.passes_hopeless(64)
    record(d, ["a", "b"])
    assert d.rows_without_context(2) == []
    crowd = ["a", "b", *[f"r{i}" for i in range(62)]]
    record(d, crowd)
    assert d.rows_without_context(64) == list(range(64))  # the whole batch is plain now
    record(d, ["a", "b"])
    assert d.rows_without_context(2) == [0, 1]  # and stays without context
    record(d, ["a", "z"])
    assert d.rows_without_context(2) == [0]  # a newcomer at two requests keeps it


def test_context_is_kept_without_a_record_without_deferred_writes_or_outside_adaptive():
    d = drafting()
    close_band_of(d, 1)
    assert d.rows_without_context(1) == []  # no record from P6 this step
    record(d, ["a"])
    d.policy.mode = PolicyMode.FULL
    assert d.rows_without_context(1) == []
    immediate = drafting(deferred=False)
    close_band_of(immediate, 1)
    record(immediate, ["a"])
    assert immediate.rows_without_context(1) == []


def test_a_request_without_context_gets_lookup_drafts_but_none_of_the_drafters():
    d = drafting(lookup=True)
    record(d, ["a", "b"], rows=[PROMPT + [7], [40, 41]])
    matches = d.lookup(2, BLOCK)
    assert matches[0] is not None and matches[1] is None
    drafter_rows = torch.tensor([[50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65]])
    d.confidence = torch.full((2 * BLOCK,), 0.99)  # the drafter is sure of both
    selected = d.select(drafter_rows, torch.tensor([8, 42]), (), matches, no_drafter=[0, 1])
    assert selected[0] and isinstance(d._pending[(8, *selected[0])], LookupDraft)
    assert selected[1] == []  # no context, no lookup match: nothing
    d.confidence = torch.full((2 * BLOCK,), 0.99)
    again = d.select(drafter_rows, torch.tensor([8, 42]), (), None, no_drafter=[1])
    assert again[0] and again[0] == drafter_rows[0, :len(again[0])].tolist() and again[1] == []


class FakeProposer:
    """The proposer attributes _store_context_only reads: vLLM's kernel is replaced by one that
    fills the context buffers with recognisable positions and slots."""

    def __init__(self, num_tokens):
        self._context_positions_buffer = torch.zeros(64, dtype=torch.long)
        self._context_slot_mapping_buffer = torch.zeros(64, dtype=torch.long)
        self.model = SimpleNamespace()
        self.num_tokens = num_tokens

    def set_inputs_first_pass(self, *, target_token_ids, target_positions, **_):
        n = target_token_ids.shape[0]
        self._context_positions_buffer[:n] = target_positions
        self._context_slot_mapping_buffer[:n] = target_positions + 1000
        return n, None, None


def test_context_tokens_of_requests_without_context_are_not_held():
    d = drafting()
    # three requests: 3 prompt tokens, 1 token, 2 tokens; the middle one has no context
    starts = torch.tensor([0, 3, 4, 6])
    cad = SimpleNamespace(query_start_loc_cpu=starts, batch_size=lambda: 3)
    positions = torch.tensor([0, 1, 2, 9, 4, 5])
    hidden = torch.arange(6, dtype=torch.float32)[:, None].repeat(1, 4)
    proposer = FakeProposer(6)
    patches._store_context_only(proposer, d, torch.arange(6), positions, hidden,
                                torch.tensor([1, 2, 3]), cad, None, [1])
    held = d.deferred_context
    assert held.num_tokens == 5
    assert held._positions[0].tolist() == [0, 1, 2, 4, 5]
    assert held._slots[0].tolist() == [1000, 1001, 1002, 1004, 1005]
    assert held._states[0][:, 0].tolist() == [0, 1, 2, 4, 5]
    # nobody keeps context: nothing is computed or held
    patches._store_context_only(proposer, d, torch.arange(6), positions, hidden,
                                torch.tensor([1, 2, 3]), cad, None, [0, 1, 2])
    assert held.num_tokens == 5


def test_without_a_draft_pass_no_lookup_where_it_cannot_be_used():
    """A step that runs no draft pass looks up n-grams only where lookup-only drafts could
    pay at its batch size and their gate may grant them; a step the closed gate would refuse
    counts towards its next try instead, and once a try is due the lookup runs again."""
    d = drafting(lookup=True)
    costs = d.policy.costs
    rows = [PROMPT + [7], [40, 41], [50, 51]]
    record(d, ["a", "b", "c"], rows=rows)
    assert d.lookup(3, BLOCK, (), draft_pass=False)[0] is not None  # open: looked up
    gate = d.ngram.gate
    for _ in range(3):
        gate.gate.record_value(3, -1.0)  # lookup-only steps at 2-3 requests lost time
    record(d, ["a", "b", "c"], rows=rows)
    assert d.lookup(3, BLOCK, (), draft_pass=False) == []
    assert gate.gate.bands[2].steps_closed == 1 and d.step_tokens is None
    record(d, ["a", "b", "c"], rows=rows)
    assert d.lookup(3, BLOCK, (), draft_pass=True)[0] is not None  # a pass may still mix it in
    gate.gate.bands[2].steps_closed = 10 ** 6  # a try is due
    record(d, ["a", "b", "c"], rows=rows)
    assert d.lookup(3, BLOCK, (), draft_pass=False)[0] is not None
    # where even a match for every request at the best calibrated chances would not pay
    crowd = [f"r{i}" for i in range(64)]
    assert not d.ngram.could_pay(costs, 64, BLOCK) and d.ngram.could_pay(costs, 3, BLOCK)
    record(d, crowd, rows=[PROMPT + [7]] * 64)
    assert d.lookup(64, BLOCK, (), draft_pass=False) == [] and 7 not in gate.gate.bands
    # the answer follows the calibration: every n-gram length seen rejected, not even at 3
    for _ in range(300):
        for ngram in (2, 3, 4):
            d.ngram.calibration.observe([ngram], [BLOCK], [0])
    assert not d.ngram.could_pay(costs, 3, BLOCK)
