"""Drafts retrieved from the target's answers (dflash_plugin.datastore)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_plugin.datastore import AnswerDatastore, load_answers_datastore
from dflash_plugin.errors import DFlashError

ANSWERS = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 2, 3, 4, 6], [1, 2, 3, 4, 5, 8]]


def test_the_longest_ngram_gives_its_most_common_continuation():
    ds = AnswerDatastore.build(ANSWERS, ngram_sizes=(4, 3, 2), continuation=4)
    # "1 2 3" went on with 4 twice and 9 once: the first answer that went on with 4 is copied
    match = ds.continuation([0, 1, 2, 3])
    assert match.ngram == 3 and match.tokens.tolist() == [4, 5]
    assert match.share == pytest.approx(2 / 3) and match.count == 3
    # "7 2 3 4" occurs once: the 4-gram wins over the commoner "2 3 4"
    match = ds.continuation([7, 2, 3, 4])
    assert (match.ngram, match.tokens.tolist(), match.count) == (4, [6], 1)
    # only "2 3" ends this history: 4 of its occurrences, 3 of them followed by 4
    match = ds.continuation([0, 2, 3])
    assert (match.ngram, match.share, match.count) == (2, 0.75, 4)
    assert ds.continuation([0, 2, 3], min_ngram=3) is None
    assert ds.continuation([42]) is None and ds.continuation([]) is None


def test_no_ngram_or_continuation_crosses_two_answers():
    ds = AnswerDatastore.build([[1, 2], [3, 4, 5]], ngram_sizes=(2,), continuation=8)
    assert ds.continuation([2, 3]) is None  # "2 3" spans the boundary between the answers
    assert ds.continuation([3, 4]).tokens.tolist() == [5]  # stops at its answer's end
    assert ds.continuation([4, 5]) is None  # nothing followed it


def test_continuation_length_is_capped():
    ds = AnswerDatastore.build([list(range(10, 40))], ngram_sizes=(2,), continuation=5)
    assert ds.continuation([10, 11]).tokens.tolist() == [12, 13, 14, 15, 16]
    assert ds.continuation([10, 11], length=2).tokens.tolist() == [12, 13]


def test_saved_datastore_loads_with_the_same_matches(tmp_path):
    ds = AnswerDatastore.build(ANSWERS, continuation=4)
    ds.save(tmp_path / "ds.npz")
    loaded = AnswerDatastore.load(tmp_path / "ds.npz")
    assert loaded.length == 4 and list(loaded.index) == list(ds.index)
    for history in ([0, 1, 2, 3], [7, 2, 3, 4], [0, 2, 3], [3, 4]):
        a, b = ds.continuation(history), loaded.continuation(history)
        assert (a.ngram, a.share, a.count) == (b.ngram, b.share, b.count)
        np.testing.assert_array_equal(a.tokens, b.tokens)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no answers"):
        AnswerDatastore.build([])
    with pytest.raises(ValueError, match="positive"):
        AnswerDatastore.build(ANSWERS, ngram_sizes=(2, 0))


def test_answers_too_short_for_an_ngram_size_leave_it_out():
    ds = AnswerDatastore.build([[1, 2, 3]], ngram_sizes=(5, 3, 2))
    assert list(ds.index) == [2]  # "1 2 3" has no 3-gram with a token after it
    assert ds.continuation([1, 2]).tokens.tolist() == [3]


def test_answer_files_build_it_and_other_files_are_refused_by_line(tmp_path):
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"response_ids": a}) + "\n" for a in ANSWERS))
    ds = load_answers_datastore([answers])
    assert ds.continuation([0, 1, 2, 3]).tokens.tolist()[:2] == [4, 5]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(DFlashError, match="prompts.jsonl line 1: not an answer record"):
        load_answers_datastore([answers, prompts])


def test_batched_drafts_are_the_drafts_of_each_history():
    rng = np.random.default_rng(0)
    # A small vocabulary, so that histories hit indexed n-grams of every length and some of them
    # fall under the share a draft needs.
    answers = [rng.integers(0, 6, size=rng.integers(4, 40)).tolist() for _ in range(60)]
    ds = AnswerDatastore.build(answers, continuation=6)
    histories = [rng.integers(0, 6, size=rng.integers(0, 9)).tolist() for _ in range(300)]
    histories += [a[:cut] for a in answers[:40] for cut in (3, 5, len(a) - 1)]
    width = ds.max_ngram
    tails = np.full((len(histories), width), -5)
    sizes = np.array([min(len(h), width) for h in histories])
    for row, history in enumerate(histories):
        if sizes[row]:
            tails[row, width - sizes[row]:] = history[-sizes[row]:]
    batched = ds.drafts(tails, sizes, length=4)
    assert [[] if m is None else m.tokens.tolist() for m in batched] == \
        [ds.draft(h, 4) for h in histories]
    drafted = [m for m in batched if m is not None]
    assert len(drafted) > 50 and {m.ngram for m in drafted} == {3, 4, 5}
    assert all(m.share >= 0.5 for m in drafted)
    assert any(ds.continuation(h, min_ngram=3) and not ds.draft(h) for h in histories), \
        "some longest matches should be too rare a continuation to draft"


def test_a_datastore_built_from_answer_files_is_cached_while_they_stay_the_same(tmp_path):
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"response_ids": a}) + "\n" for a in ANSWERS))
    cache = tmp_path / "cache"
    built = load_answers_datastore([answers], cache)
    saved = list(cache.glob("answers-*.npz"))
    assert len(saved) == 1 and not list(cache.glob("*.partial.npz"))
    saved[0].write_bytes(b"damaged")  # a damaged cache is built again, not trusted
    again = load_answers_datastore([answers], cache)
    assert again.continuation([0, 1, 2, 3]).tokens.tolist() == [4, 5]
    assert AnswerDatastore.load(saved[0]).continuation([7, 2, 3, 4]).tokens.tolist() == \
        built.continuation([7, 2, 3, 4]).tokens.tolist()
    # changed answers: another cache file, with the new continuations
    answers.write_text(json.dumps({"response_ids": [1, 2, 3, 77, 78]}) + "\n")
    changed = load_answers_datastore([answers], cache)
    assert changed.continuation([1, 2, 3]).tokens.tolist() == [77, 78]
    assert len(list(cache.glob("answers-*.npz"))) == 2
