"""Prompt-lookup drafts in the vLLM adapter (engine-free): token histories from the runner's
input batch (what P5 records), lookup-only steps, per-request choice after a draft pass, and
learning from verification."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dflash_plugin.draft_policy import DraftPolicy, PolicyMode, cumulative_acceptance
from dflash_plugin.draft_policy import vllm_cpu_fp32_costs
from dflash_plugin.ngram import NgramDrafts
from vllm_ext.drafting import Drafting, LookupDraft
from vllm_ext.ngram_drafts import PREPARE_PARAMS, histories

BLOCK = 6
# A "prompt" the answer is copying: ... 7 8 9 10 11 12 13 ...; the answer so far ends in 8, 9
PROMPT = [1, 2, 7, 8, 9, 10, 11, 12, 13, 3]


def input_batch(rows: list[list[int]], vocab=100):
    width = 32
    token_ids = np.zeros((4, width), dtype=np.int32)
    for i, row in enumerate(rows):
        token_ids[i, :len(row)] = row
    return SimpleNamespace(token_ids_cpu=token_ids, vocab_size=vocab,
                           num_tokens_no_spec=np.array([len(r) for r in rows] + [0] * (4 - len(rows))))


def test_histories_join_the_batch_and_this_steps_accepted_tokens():
    batch = input_batch([PROMPT + [7], [5, 6], [4, 4, 4]])
    sampled = torch.tensor([[8, 9, -1], [6, -1, -1], [-1, -1, -1]], dtype=torch.int32)
    discard = torch.tensor([False, True, False, False])
    rows = histories((batch, sampled, discard), 3)
    assert rows[0].tolist() == PROMPT + [7, 8, 9]
    assert rows[1] is None  # a prefill chunk: its token was not sampled
    assert rows[2] is None  # nothing valid sampled
    assert histories(None, 3) == [None] * 3
    assert histories((batch, sampled, discard), 2) == [None] * 2  # not this step's record
    assert histories((SimpleNamespace(), sampled, discard), 3) == [None] * 3
    assert PREPARE_PARAMS[0] == "self" and "gpu_input_batch" in PREPARE_PARAMS


def drafting_with_lookup(drafter_acceptance=0.5, lookup_rate=None) -> Drafting:
    policy = DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(BLOCK + 1), BLOCK)
    policy.curve = cumulative_acceptance(torch.full((BLOCK,), drafter_acceptance))
    ngram = NgramDrafts(policy.block)
    if lookup_rate is not None:
        for _ in range(100):
            ngram.calibration.observe([2], [BLOCK], [int(lookup_rate * BLOCK)])
    return Drafting(policy, ngram=ngram)


def record(drafting, rows, sampled):
    drafting.step_tokens = (input_batch(rows), torch.tensor(sampled, dtype=torch.int32),
                            torch.zeros(4, dtype=torch.bool))


def test_a_lookup_only_step_hands_out_the_copy_and_learns_from_its_verification():
    drafting = drafting_with_lookup(0.5, lookup_rate=1.0)
    record(drafting, [PROMPT + [7], [40, 41]], [[8, -1], [42, -1]])
    matches = drafting.lookup(2, BLOCK)
    assert drafting.step_tokens is None  # used once
    assert matches[0].tokens.tolist() == [9, 10, 11, 12, 13, 3] and matches[1] is None
    lengths = drafting.lookup_only(matches, BLOCK, draft_pass=True)
    assert lengths[0] > 0 and lengths[1] == 0
    drafts = drafting.lookup_drafts(2, matches, lengths, torch.tensor([8, 42]))
    assert drafts == [[9, 10, 11, 12, 13, 3][:lengths[0]], []]
    assert drafting._pending == {(8, *drafts[0]): LookupDraft(2)}
    before = drafting.ngram.calibration.num_drafts_seen
    # next step: the target verified the copy; 3 of its tokens were accepted
    ids = torch.tensor([8, *drafts[0], 42])
    drafting.learn(ids, torch.tensor([0, 1 + len(drafts[0]), 2 + len(drafts[0])]),
                   torch.tensor([len(drafts[0]) - 3, 0]))
    assert drafting.ngram.calibration.num_drafts_seen == before + 1
    assert drafting.ngram.counts.tokens_accepted == 3
    assert drafting.policy.calibration.num_drafts_seen == 0  # the drafter's is left alone


def test_lookup_is_off_outside_the_adaptive_policy_and_for_plain_rows():
    drafting = drafting_with_lookup(lookup_rate=1.0)
    record(drafting, [PROMPT + [7], PROMPT + [7]], [[8, -1], [8, -1]])
    assert [m is None for m in drafting.lookup(2, BLOCK, no_drafts=[1])] == [False, True]
    drafting.policy.mode = PolicyMode.FULL
    record(drafting, [PROMPT + [7]], [[8, -1]])
    assert drafting.lookup(1, BLOCK) == []
    assert drafting.lookup_only([], BLOCK, True) is None
    assert drafting.lookup_drafts(2, [], None, torch.tensor([1, 2])) == [[], []]
    assert Drafting(drafting.policy).lookup(1, BLOCK) == []  # lookup switched off


def test_after_a_draft_pass_the_better_draft_wins_per_request():
    drafting = drafting_with_lookup(0.9, lookup_rate=1.0)
    record(drafting, [PROMPT + [7], [40, 41]], [[8, -1], [42, -1]])
    matches = drafting.lookup(2, BLOCK)
    drafter_rows = torch.tensor([[50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65]])
    # the drafter is unsure about request 0 (where lookup copies) and sure about request 1
    drafting.confidence = torch.tensor([[0.3] * BLOCK, [0.99] * BLOCK]).reshape(-1)
    selected = drafting.select(drafter_rows, torch.tensor([8, 42]), (), matches)
    assert selected[0] == [9, 10, 11, 12, 13, 3][:len(selected[0])] and selected[0]
    assert selected[1] == [60, 61, 62, 63, 64, 65][:len(selected[1])] and selected[1]
    assert isinstance(drafting._pending[(8, *selected[0])], LookupDraft)
    assert isinstance(drafting._pending[(42, *selected[1])], torch.Tensor)
    assert drafting.ngram.counts.drafts_handed_out == 1
    # without matches (lookup off, or draft distributions in play) the drafter's rows stand
    drafting.confidence = torch.tensor([[0.3] * BLOCK, [0.99] * BLOCK]).reshape(-1)
    plain = drafting.select(drafter_rows, torch.tensor([8, 42]), (), None)
    assert all(row == drafter_rows[i, :len(row)].tolist() for i, row in enumerate(plain))


@pytest.mark.parametrize("value", ["on", "off"])
def test_switch_from_the_environment(monkeypatch, value):
    from vllm_ext.ngram_drafts import ngram_drafts_from_env, start

    monkeypatch.setenv("DFLASH_NGRAM_DRAFTS", value)
    assert ngram_drafts_from_env() is (value == "on")
    if value == "off":
        assert start(DraftPolicy(PolicyMode.ADAPTIVE, vllm_cpu_fp32_costs(7), 6)) is None
    monkeypatch.setenv("DFLASH_NGRAM_DRAFTS", "sometimes")
    with pytest.raises(ValueError, match="DFLASH_NGRAM_DRAFTS"):
        ngram_drafts_from_env()


def test_history_hook_guard_passes_on_the_installed_vllm_and_refuses_a_changed_signature():
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.guards import hook_problems

    expected = {"prepare_next_token_ids_padded": PREPARE_PARAMS}
    assert hook_problems(DFlashProposer, expected) == []

    class Changed:
        def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch):
            pass

    assert "parameters" in hook_problems(Changed, expected)[0]


def test_hints_go_into_each_requests_mask_slots_for_one_call_only():
    """A6: for a drafter trained with lookup hints, the query blocks set_inputs_first_pass lays
    out (bonus, then masks, per request) get each request's lookup continuation after its bonus;
    the wrap is gone after the call."""
    from dflash_plugin.ngram import NgramMatch
    from vllm_ext.patches import _writing_hints, write_hints

    mask = 0

    class Proposer:
        num_speculative_tokens = 3

        def __init__(self):
            self.input_ids = torch.full((12,), -1, dtype=torch.int32)

        def set_inputs_first_pass(self, bonus):
            self.input_ids[:8] = torch.tensor([bonus[0], mask, mask, mask,
                                               bonus[1], mask, mask, mask], dtype=torch.int32)
            return 8

    matches = [NgramMatch(np.array([5, 6, 7, 8, 9]), 2), None]
    proposer = Proposer()
    with _writing_hints(proposer, matches):
        assert proposer.set_inputs_first_pass([4, 3]) == 8
    assert proposer.input_ids[:8].tolist() == [4, 5, 6, 7, 3, mask, mask, mask]
    assert "set_inputs_first_pass" not in vars(proposer)
    proposer.set_inputs_first_pass([4, 3])  # outside the wrap: masks again
    assert proposer.input_ids[:8].tolist() == [4, mask, mask, mask, 3, mask, mask, mask]
    with _writing_hints(proposer, [None, None]):  # nothing to write: no wrap at all
        assert "set_inputs_first_pass" not in vars(proposer)
    ids = torch.zeros(6, dtype=torch.int64)
    write_hints(ids, [None, NgramMatch(np.array([7]), 3)], per_request=3)
    assert ids.tolist() == [0, 0, 0, 0, 7, 0]


def test_lookup_only_steps_are_booked_by_their_time_against_draft_free_steps():
    """The propose hook's view: draft-free steps of two requests take 50 ms, then a step that
    verified a lookup draft took 80 ms and had 3 of its tokens accepted. The gate books
    3/2 - (80 - 50)/50 plain steps of two requests, from those times, not from the model."""
    from dflash_plugin.step_clock import StepClock

    drafting = drafting_with_lookup(0.5, lookup_rate=1.0)
    drafting.clock = StepClock(drafting.policy.costs, BLOCK + 1)
    clock_ms = [100.0]
    drafting.now = lambda: clock_ms[0] / 1e3

    def step(ms, queries, ids, rejected, hand_out=False, propose_ms=0.0):
        clock_ms[0] += ms  # the target step between two propose calls
        starts = torch.tensor([0, *np.cumsum(queries)], dtype=torch.int32)
        cad = SimpleNamespace(batch_size=lambda: len(queries), query_start_loc_cpu=starts,
                              num_actual_tokens=int(starts[-1]))
        with drafting.timing_step(cad):
            drafting.learn(torch.tensor(ids), starts, torch.tensor(rejected))
            clock_ms[0] += propose_ms  # the proposal's own work
            if hand_out:
                record(drafting, [PROMPT + [7], [40, 41]], [[8, -1], [42, -1]])
                matches = drafting.lookup(2, BLOCK)
                lengths = drafting.lookup_only(matches, BLOCK, draft_pass=False)
                return drafting.lookup_drafts(2, matches, lengths, torch.tensor([8, 42]))

    step(0.0, [300, 1], [0] * 301, [0, 0])  # a prefill: neither timed nor a reference
    for _ in range(4):
        step(50.0, [1, 1], [5, 6], [0, 0])
    gate = drafting.ngram.gate
    assert gate.draft_free.reference(2) == pytest.approx(50.0)
    drafts = step(50.0, [1, 1], [5, 6], [0, 0], hand_out=True)[0]
    assert len(drafts) >= 4
    # the proposal after verified drafts does vLLM's rejected-token bookkeeping: 10 ms here,
    # booked with the step (the draft-free ones' 0 ms proposals are in the reference)
    step(70.0, [1 + len(drafts), 1], [8, *drafts, 42], [len(drafts) - 3, 0], propose_ms=10.0)
    assert (gate.timed, gate.priced) == (1, 0)
    assert gate.gate.bands[2].net == pytest.approx(3 / 2 - 30 / 50)
    assert "lookup-only steps by batch: 2-3 requests open (+0.90 per step)" in gate.summary()


def test_step_tails_are_the_ends_of_the_histories():
    from vllm_ext.ngram_drafts import step_tails

    batch = input_batch([PROMPT + [7], [5, 6], [4, 4, 4], [30]])
    sampled = torch.tensor([[8, 9, -1], [6, -1, -1], [-1, -1, -1], [31, 32, 33]],
                           dtype=torch.int32)
    discard = torch.tensor([False, True, False, False])
    step = (batch, sampled, discard)
    tails, sizes = step_tails(step, 4, 5)
    rows = histories(step, 4)
    for i, history in enumerate(rows):
        if history is None:
            assert sizes[i] == 0
            continue
        assert sizes[i] == min(5, len(history))
        assert tails[i, 5 - sizes[i]:].tolist() == history[-sizes[i]:].tolist()
    assert sizes.tolist() == [5, 0, 0, 4]
    assert step_tails(None, 2, 5)[1].tolist() == [0, 0]


def test_retrieved_drafts_are_handed_out_and_learnt_apart_from_lookup():
    from dflash_plugin.datastore import AnswerDatastore

    drafting = drafting_with_lookup(0.5, lookup_rate=1.0)
    # The target once went on "40 41 42" -> "43 44 45 46 47 48"; the second request's history
    # ends in 40 41 42 and has no n-gram of its own to copy.
    drafting.ngram.datastore = AnswerDatastore.build([[39, 40, 41, 42, 43, 44, 45, 46, 47, 48]],
                                                     continuation=BLOCK)
    for _ in range(100):  # retrieved 3-gram drafts have been right so far
        drafting.ngram.calibration.observe([3], [BLOCK], [BLOCK], [True])
    record(drafting, [PROMPT + [7], [40, 41]], [[8, -1], [42, -1]])
    matches = drafting.lookup(2, BLOCK)
    assert not matches[0].retrieved and matches[0].tokens.tolist() == [9, 10, 11, 12, 13, 3]
    assert matches[1].retrieved and matches[1].tokens.tolist() == [43, 44, 45, 46, 47, 48]
    drafter_rows = torch.tensor([[50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65]])
    drafting.confidence = torch.tensor([[0.1] * BLOCK, [0.1] * BLOCK]).reshape(-1)
    selected = drafting.select(drafter_rows, torch.tensor([8, 42]), (), matches)
    assert selected[1] == [43, 44, 45, 46, 47, 48]
    assert drafting._pending[(42, *selected[1])] == LookupDraft(3, retrieved=True)
    assert drafting.ngram.counts.retrieved_handed_out == 1
    # the target accepts two of the retrieved tokens: the retrieved 3-gram row learns it
    n0, n1 = len(selected[0]), len(selected[1])
    ids = torch.tensor([8, *selected[0], 42, *selected[1]])
    drafting.learn(ids, torch.tensor([0, 1 + n0, 2 + n0 + n1]), torch.tensor([0, n1 - 2]))
    calibration = drafting.ngram.calibration
    row = calibration._row(3, retrieved=True)
    missed = calibration.tried[row] - calibration.accepted[row]
    assert missed[2] > missed[1] + 0.9  # the third token was the one rejected
    assert calibration.tried[row, 2] > calibration.tried[row, 3] + 0.9  # seen: tokens 1-3
    assert calibration.tried[calibration._row(3)].max() < 4  # lookup's 3-gram row: untouched
    assert drafting.ngram.counts.retrieved_tokens_accepted == 2


def test_datastore_from_the_environment(monkeypatch, tmp_path):
    import json

    from dflash_plugin.switches import SwitchError
    from vllm_ext.ngram_drafts import datastore_files_from_env, load_datastore

    monkeypatch.delenv("DFLASH_DATASTORE", raising=False)
    assert datastore_files_from_env() == [] and load_datastore([], 100) is None
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"response_ids": [1, 2, 3, 4, 5, 99]}) + "\n")
    monkeypatch.setenv("DFLASH_DATASTORE", f"{answers}, {tmp_path / 'missing.jsonl'}")
    with pytest.raises(SwitchError, match="DFLASH_DATASTORE: no such file: .*missing.jsonl"):
        datastore_files_from_env()
    monkeypatch.setenv("DFLASH_DATASTORE", str(answers))
    files = datastore_files_from_env()
    assert files == [answers]
    assert load_datastore(files, 100).draft([1, 2, 3]) == [4, 5, 99]
    with pytest.raises(SwitchError, match="token id 99, outside this target's vocabulary of 50"):
        load_datastore(files, 50)
