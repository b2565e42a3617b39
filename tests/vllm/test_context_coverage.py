"""Context coverage on its own (engine-free; the engine test is in test_engine.py: requests
decoded under a load where no draft pays off are not drafted later, and stay lossless)."""

import pytest
import torch

from dflash_plugin.draft_policy import DraftPolicy, PolicyMode, vllm_cpu_fp32_costs
from vllm_ext.context_coverage import ContextCoverage
from vllm_ext.drafting import Drafting, context_gaps_from_env

BLOCK_SIZE = 4
# Two requests: row 0 holds blocks 3 and 5, row 1 blocks 1 and 2; the last column is unused.
BLOCK_TABLE = torch.tensor([[3, 5, 0], [1, 2, 7]])


def slots_of(blocks, positions):
    return torch.tensor([blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                         for p in positions])


def test_a_row_is_complete_when_every_position_of_its_context_was_written():
    coverage = ContextCoverage()
    coverage.record(slots_of([3, 5], range(6)), written=True)
    assert coverage.rows_complete(BLOCK_TABLE, torch.tensor([6, 0]), BLOCK_SIZE) == [True, True]
    # Row 0's seventh position and row 1's first were never written.
    assert coverage.rows_complete(BLOCK_TABLE, torch.tensor([7, 1]), BLOCK_SIZE) == [False, False]


def test_a_skipped_step_leaves_a_gap_until_the_slot_is_written_again():
    coverage = ContextCoverage()
    coverage.record(slots_of([1, 2], range(5)), written=True)
    coverage.record(slots_of([1, 2], [5]), written=False)
    coverage.record(slots_of([1, 2], [6]), written=True)
    lens = torch.tensor([0, 7])
    assert coverage.rows_complete(BLOCK_TABLE, lens, BLOCK_SIZE) == [True, False]
    assert coverage.skipped_tokens == 1
    # The slot is handed to a new token (a new request reusing the block) that is written.
    coverage.record(slots_of([1, 2], [5]), written=True)
    assert coverage.rows_complete(BLOCK_TABLE, lens, BLOCK_SIZE) == [True, True]


def test_positions_beyond_the_context_and_padding_slots_are_ignored():
    coverage = ContextCoverage()
    # -1 is vLLM's padding slot: it names no cache entry and must not index the flags.
    coverage.record(torch.tensor([-1, 12, 13, -1]), written=True)
    assert coverage.rows_complete(BLOCK_TABLE, torch.tensor([2, 0]), BLOCK_SIZE) == [True, True]
    coverage.record(torch.tensor([-1, -1]), written=False)
    assert coverage.skipped_tokens == 0


def test_flags_grow_to_the_largest_slot_seen():
    coverage = ContextCoverage()
    coverage.record(torch.tensor([2]), written=True)
    far = torch.tensor([[1000]])
    assert coverage.rows_complete(far, torch.tensor([1]), BLOCK_SIZE) == [False]
    coverage.record(torch.tensor([4000]), written=True)
    assert coverage.rows_complete(far, torch.tensor([1]), BLOCK_SIZE) == [True]
    assert coverage.rows_complete(far[:0], torch.tensor([], dtype=torch.int64),
                                  BLOCK_SIZE) == []


def float32_policy(mode=PolicyMode.ADAPTIVE):
    return DraftPolicy(mode, vllm_cpu_fp32_costs(4), block=3)


def test_only_decoding_steps_where_no_draft_pays_off_skip_their_context():
    drafting = Drafting(float32_policy(), coverage=ContextCoverage())
    possible = [batch for batch in range(1, 33) if drafting.policy.drafts_possible(batch)]
    assert possible == list(range(1, possible[-1] + 1)) and 4 <= possible[-1] < 16
    assert drafting.stores_context(4, decoding_only=True)
    assert not drafting.stores_context(16, decoding_only=True)
    assert drafting.stores_context(16, decoding_only=False)  # prompt tokens: always
    untracked = Drafting(float32_policy(), coverage=None)
    assert untracked.stores_context(32, decoding_only=True)


def test_modes_that_always_draft_always_store_context_and_off_never_needs_it():
    for mode in (PolicyMode.FULL, PolicyMode.STAGGER):
        assert Drafting(float32_policy(mode), coverage=ContextCoverage()).stores_context(
            64, decoding_only=True)
    off = Drafting(float32_policy(PolicyMode.OFF), coverage=ContextCoverage())
    assert not off.stores_context(1, decoding_only=True)


def test_environment_switch(monkeypatch):
    monkeypatch.delenv("DFLASH_CONTEXT_GAPS", raising=False)
    assert not context_gaps_from_env()  # opt-in: no end-to-end gain measured yet
    monkeypatch.setenv("DFLASH_CONTEXT_GAPS", "on")
    assert context_gaps_from_env()
    monkeypatch.setenv("DFLASH_CONTEXT_GAPS", "maybe")
    with pytest.raises(ValueError, match="DFLASH_CONTEXT_GAPS"):
        context_gaps_from_env()
