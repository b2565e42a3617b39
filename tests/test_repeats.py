"""Answers that go round in a loop: found, stopped while answering, trimmed for training."""

import json

import pytest

from dflash_plugin.train.feature_store import _trainable
from dflash_plugin.train.repeats import LOOP_WINDOW, loop_end, trim_loop
from dflash_plugin.train.responses import answer_in_segments, settle

CYCLE = list(range(100, 140))  # a 40-token sentence the answer repeats


def test_loop_end_keeps_two_cycles_of_a_repeated_sentence():
    ids = [1, 2, 3] + CYCLE * 6
    end = loop_end(ids)
    # the third time the first 32 tokens of the cycle appear ends the kept answer
    assert end == 3 + 2 * len(CYCLE) + LOOP_WINDOW
    assert trim_loop(ids) == ids[:end]


def test_loop_end_finds_a_one_token_loop_and_ignores_short_repeats():
    assert loop_end([5] * 100) == LOOP_WINDOW + 2
    # a 20-token phrase used three times is shorter than the window: not a loop
    phrase = list(range(200, 220))
    fluent = phrase + [1] + phrase + [2] + phrase + [3]
    assert loop_end(fluent) is None and trim_loop(fluent) == fluent
    # two cycles are not yet a loop
    assert loop_end(CYCLE * 2) is None


def test_loop_end_rejects_bad_parameters():
    with pytest.raises(ValueError):
        loop_end([1, 2, 3], window=0)
    with pytest.raises(ValueError):
        loop_end([1, 2, 3], times=1)


def test_settle_prefers_the_loop_then_eos_then_cap():
    looping = CYCLE * 4
    assert settle(looping, True, 1024) == (looping[:loop_end(looping)], "loop")
    assert settle([1, 2, 3], True, 1024) == ([1, 2, 3], "eos")
    assert settle([1, 2, 3], False, 3) == ([1, 2, 3], "cap")
    assert settle([1, 2, 3], False, 4) is None


class FakeEngine:
    """Greedy 'target': each prompt's continuation is a fixed token stream; records requests."""

    def __init__(self, streams: dict[int, list[int]], eos: int = 0):
        self.streams, self.eos, self.requests = streams, eos, []

    def __call__(self, requests):
        self.requests.append(requests)
        replies = []
        for ids, n in requests:
            stream = self.streams[ids[0]]
            done = len(ids) - 1  # prompts are one token: the key of their stream
            new = stream[done:done + n]
            at_eos = self.eos in new
            if at_eos:
                new = new[:new.index(self.eos) + 1]
            replies.append((new, at_eos))
        return replies


def test_answer_in_segments_continues_on_the_answer_so_far_and_stops_each_way():
    streams = {1: list(range(300, 350)) + [0],          # ends at EOS in the second segment
               2: [7, 8] + CYCLE * 30,                   # loops
               3: list(range(1000, 2000))}               # runs to the cap
    engine = FakeEngine(streams)
    out = answer_in_segments(engine, [[1], [2], [3]], cap=200, segment=32)
    assert out[0] == (streams[1], "eos")
    looped = [7, 8] + CYCLE * 30
    assert out[1] == (looped[:loop_end(looped)], "loop")
    assert out[2] == (streams[3][:200], "cap")
    # each round continues a prompt on prompt + answer so far, and asks only for what is left
    first, second = engine.requests[0], engine.requests[1]
    assert [len(ids) for ids, _ in first] == [1, 1, 1]
    assert second[0] == ([1] + streams[1][:32], 32)
    assert engine.requests[-1] == [([3] + streams[3][:192], 8)]
    # the looping answer stopped long before the cap
    assert sum(1 for rnd in engine.requests for ids, _ in rnd if ids[0] == 2) <= 4


def test_training_reads_an_old_capped_loop_only_up_to_its_loop():
    looped = [7, 8] + CYCLE * 30
    record = {"prompt_ids": [1, 2], "response_ids": looped}
    assert _trainable(record, 4096) == [1, 2] + looped[:loop_end(looped)]
    # a record whose answer was already stopped at its loop reads back whole
    record["response_ids"] = trim_loop(looped)
    assert _trainable(json.loads(json.dumps(record)), 4096) == [1, 2] + trim_loop(looped)
