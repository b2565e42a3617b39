"""Prompts written by the target: the user-turn prefix of the real chat template, the rejection
rules, near-duplicate and evaluation-overlap screening, and the count/limit loop."""

from __future__ import annotations

import json

import pytest

from dflash_plugin.errors import DFlashError
from dflash_plugin.train.self_prompts import (
    SelfPromptFilter,
    SelfPromptReport,
    rejection,
    user_turn_prefix,
    write_self_prompts,
)


def test_user_turn_prefix_is_the_template_up_to_the_user_text(tokenizer):
    prefix = user_turn_prefix(tokenizer)
    text = tokenizer.decode(prefix)
    assert text.endswith("<|im_start|>user\n")
    full = tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}],
                                         tokenize=False)
    assert full.startswith(text) and full[len(text):].startswith("Hello there")


def test_user_turn_prefix_needs_a_chat_template(tokenizer):
    class Bare:
        chat_template = None
    with pytest.raises(DFlashError, match="chat template"):
        user_turn_prefix(Bare())


@pytest.mark.parametrize("text,closed,why", [
    ("How do I sort a list of tuples by the second item in Python?", True, None),
    ("How do I sort a list of tuples by the second item", False, "unfinished"),
    ("Hi there", True, "length"),
    ("Как отсортировать список кортежей по второму элементу?", True, "not_english"),
    ("Tell me a joke.\n<|im_start|>assistant\nSure", True, "role_marker"),
    ("What is a good name for a cat?\nassistant\nHow about Milo?", True, "role_marker"),
])
def test_rejection_rules(text, closed, why):
    assert rejection(text, list(range(40)), closed) == why


def test_a_looping_turn_is_rejected():
    looping = [5, 6, 7, 8] * 40
    assert rejection("Please write a very long list of words for me.", looping, True) == "loop"


def _eval_file(tmp_path, texts):
    path = tmp_path / "eval_prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"e{i}", "category": "x", "text": t}) + "\n"
                            for i, t in enumerate(texts)))
    return path


def test_filter_drops_near_duplicates_and_evaluation_overlaps(tmp_path):
    evaluation = "Can you help me write a toast for my sister's wedding next month please?"
    report = SelfPromptReport()
    screen = SelfPromptFilter([_eval_file(tmp_path, [evaluation])], report)
    ids = list(range(30))
    first = "What are some good ways to stay focused while working from home all day long?"
    assert screen.keep(first, ids, True) is not None
    assert screen.keep(first + " Thanks!", ids, True) is None          # near duplicate
    assert screen.keep("I was wondering: can you help me write a toast for my sister's "
                       "wedding next month please?", ids, True) is None   # shares an 8-gram
    kept = screen.keep("Explain how a bicycle gear system works, in simple terms for a kid.",
                       ids, True)
    assert kept is not None and kept.source == "self" and kept.id.startswith("self-")
    assert (report.sampled, report.kept, report.near_duplicates, report.contaminated) == \
        (4, 2, 1, 1)


def test_write_self_prompts_stops_at_the_count_and_the_sample_limit(tokenizer, tmp_path):
    topics = ["gardening", "chess", "taxes", "baking", "sailing", "poetry", "rust", "jazz"]
    calls = []

    def sampler(prefix, seeds, temperature, top_p):
        calls.append(len(seeds))
        assert prefix == user_turn_prefix(tokenizer)
        return [(f"Could you give me three beginner tips about {topics[s % 8]} number {s}?",
                 list(range(20)), True) for s in seeds]

    from dflash_plugin.target import resolve_target
    target = resolve_target(None)
    kept, report = write_self_prompts(target, 5, eval_files=[], batch=4, sampler=sampler)
    assert len(kept) == 5 and calls == [4, 4] and report.sampled == report.kept == 5
    assert len({p.text for p in kept}) == 5

    # Everything rejected: stops after max_samples, keeps none.
    kept, report = write_self_prompts(target, 5, eval_files=[], batch=4, max_samples=6,
                                      sampler=lambda p, s, t, q: [("x", [1], True)] * len(s))
    assert kept == [] and report.sampled == 6 and report.rejected["length"] == 6


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"top_p": 1.5}, {"count": 0}])
def test_write_self_prompts_rejects_bad_values(kwargs):
    args = {"count": 3, "temperature": 1.0, "top_p": 1.0} | kwargs
    with pytest.raises(DFlashError):
        write_self_prompts("unused", args.pop("count"), eval_files=[], sampler=lambda *a: [],
                           **args)

