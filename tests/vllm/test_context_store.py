"""The deferred context-write queue on its own (engine-free; the engine test is in
test_engine.py: drafts after deferred writes equal drafts after per-step writes)."""

import pytest
import torch

from vllm_ext.context_store import DeferredContext
from vllm_ext.drafting import defer_context_from_env

FEATURES = 6


class RecordingDrafter:
    """Stands in for the vLLM drafter: doubles the features (a visible 'projection') and
    records every write it is asked for."""

    def __init__(self):
        self.writes = []

    def combine_hidden_states(self, states):
        return states * 2

    def precompute_and_store_context_kv(self, context, positions, slots):
        self.writes.append((context.clone(), positions.clone(), slots.clone()))


def step(first_position, num_tokens, slot_base):
    positions = torch.arange(first_position, first_position + num_tokens)
    states = positions[:, None].float().expand(num_tokens, FEATURES).clone()
    return states, positions, positions + slot_base


def test_held_steps_are_written_once_in_arrival_order():
    queue, drafter = DeferredContext(max_tokens=100), RecordingDrafter()
    steps = [step(0, 5, 1000), step(5, 1, 1000), step(0, 3, 2000), step(6, 1, 1000)]
    for states, positions, slots in steps:
        assert not queue.add(states, positions, slots)
    assert queue.num_tokens == 10 and drafter.writes == []
    assert queue.flush(drafter) == 10
    assert len(drafter.writes) == 1 and queue.flushes == 1
    context, positions, slots = drafter.writes[0]
    assert torch.equal(positions, torch.cat([p for _, p, _ in steps]))
    assert torch.equal(slots, torch.cat([s for _, _, s in steps]))
    assert torch.equal(context, 2 * torch.cat([s for s, _, _ in steps]))
    # Nothing left: a second flush writes nothing.
    assert queue.flush(drafter) == 0 and queue.num_tokens == 0 and len(drafter.writes) == 1


def test_a_full_queue_asks_to_be_flushed():
    queue = DeferredContext(max_tokens=8)
    assert not queue.add(*step(0, 4, 0))
    assert not queue.add(*step(4, 3, 0))
    assert queue.add(*step(7, 1, 0))  # 8 tokens held


def test_empty_steps_add_nothing():
    queue, drafter = DeferredContext(), RecordingDrafter()
    queue.add(*step(0, 0, 0))
    assert queue.num_tokens == 0 and queue.flush(drafter) == 0 and drafter.writes == []


def test_rows_that_disagree_are_refused():
    states, positions, slots = step(0, 4, 0)
    with pytest.raises(ValueError, match="context rows disagree"):
        DeferredContext().add(states, positions[:3], slots)
    with pytest.raises(ValueError, match="max_tokens"):
        DeferredContext(max_tokens=0)


def test_environment_switch(monkeypatch):
    monkeypatch.delenv("DFLASH_DEFER_CONTEXT", raising=False)
    assert defer_context_from_env()
    monkeypatch.setenv("DFLASH_DEFER_CONTEXT", "off")
    assert not defer_context_from_env()
    monkeypatch.setenv("DFLASH_DEFER_CONTEXT", "sometimes")
    with pytest.raises(ValueError, match="DFLASH_DEFER_CONTEXT"):
        defer_context_from_env()
