import json
import re
from collections import Counter

import pytest

from dflash_plugin.train.prompts import (
    CATEGORIES,
    PROVENANCE,
    Prompt,
    build_prompts,
    more_prompts,
    normalize,
    read_jsonl,
    split_prompts,
    template_key,
    write_jsonl,
)

EXPECTED_CATEGORIES = (
    "chat", "writing", "coding", "math", "reasoning", "extraction", "stem", "humanities", "roleplay",
)


@pytest.fixture(scope="module")
def big():
    return build_prompts(500, seed=0)


def test_categories_and_provenance():
    assert CATEGORIES == EXPECTED_CATEGORIES
    assert "seed" in PROVENANCE and "external" in PROVENANCE


def test_deterministic_for_seed():
    assert build_prompts(40, seed=3) == build_prompts(40, seed=3)


def test_different_seeds_differ():
    a = {p.text for p in build_prompts(40, seed=0)}
    b = {p.text for p in build_prompts(40, seed=1)}
    assert a != b
    assert len(a & b) < len(a) // 2


def test_counts_ids_and_dedup(big):
    counts = Counter(p.category for p in big)
    assert counts == {c: 500 for c in CATEGORIES}
    assert len({normalize(p.text) for p in big}) == len(big)
    assert len({p.id for p in big}) == len(big)
    for p in big:
        assert re.fullmatch(rf"{p.category}-\d{{5}}", p.id)


def test_every_category_has_distinct_natural_prompts(big):
    for category in CATEGORIES:
        texts = [p.text for p in big if p.category == category]
        assert len(set(texts)) == 500
        for text in texts:
            assert 5 <= len(text.split()) <= 80, text
            assert "{" not in text and "}" not in text, text
            assert "  " not in text, text


def test_prefix_stable_ids():
    small, large = build_prompts(10, seed=7), build_prompts(30, seed=7)
    large_by_id = {p.id: p for p in large}
    assert all(large_by_id[p.id] == p for p in small)


def test_bad_input_raises():
    for bad in (0, -1):
        with pytest.raises(ValueError):
            build_prompts(bad)
    with pytest.raises(ValueError):
        build_prompts(10**6)  # more than any category can produce
    prompts = build_prompts(5)
    with pytest.raises(ValueError):
        split_prompts(prompts, 6)
    with pytest.raises(ValueError):
        split_prompts(prompts, -1)


def test_split_disjoint_exact_and_deterministic(big):
    train, evals = split_prompts(big, 25, seed=0)
    assert Counter(p.category for p in evals) == {c: 25 for c in CATEGORIES}
    assert len(train) + len(evals) == len(big)
    assert not {normalize(p.text) for p in train} & {normalize(p.text) for p in evals}
    assert split_prompts(big, 25, seed=0) == (train, evals)
    assert split_prompts(big, 25, seed=1)[1] != evals


def test_split_keeps_number_masked_templates_together(big):
    def key(p):
        return re.sub(r"\d+", "#", normalize(p.text))

    train, evals = split_prompts(big, 25, seed=0)
    assert not {key(p) for p in train} & {key(p) for p in evals}


def test_split_drops_train_duplicates_of_eval_text():
    dup = [Prompt("chat-00000", "chat", "Hello there, how are you today?"),
           Prompt("chat-00001", "chat", "hello   there, HOW are you today?")]
    train, evals = split_prompts(dup, 1)
    assert len(evals) == 1 and train == []


def test_jsonl_round_trip(tmp_path, big):
    path = tmp_path / "sub" / "prompts.jsonl"
    write_jsonl(path, big[:50])
    assert read_jsonl(path) == big[:50]
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"id", "category", "prompt"}
    assert [f.name for f in path.parent.iterdir()] == ["prompts.jsonl"]  # no temp file left


def test_spread_over_categories_takes_round_robin(big):
    from dflash_plugin.train.prompts import spread_over_categories

    picked = spread_over_categories(big, 20)
    counts = Counter(p.category for p in picked)
    assert len(picked) == 20 and len(counts) == len(CATEGORIES)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert spread_over_categories(big, None) == big


def test_more_prompts_are_new_and_never_near_the_held_out_split():
    train, held_out = split_prompts(build_prompts(200, seed=0), 20, seed=0)  # a first round
    extra = more_prompts(60, train, held_out, seed=0)
    assert Counter(p.category for p in extra) == {c: 60 for c in CATEGORIES}
    texts = [normalize(p.text) for p in extra]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & {normalize(p.text) for p in train + held_out}
    held_templates = {template_key(p.category, p.text) for p in held_out}
    assert not {template_key(p.category, p.text) for p in extra} & held_templates
    # A second round excludes the first round's prompts too.
    again = more_prompts(60, train + extra, held_out, seed=0)
    assert not {normalize(p.text) for p in again} & set(texts)


def test_committed_18_prompt_file_is_the_evaluations_subset():
    """train_data/.../eval_prompts_18.jsonl (what the benches in docs/benchmarks.md
    ran) must stay the 18 held-out prompts `dflash train --stages evaluate --eval-limit 18`
    evaluates on."""
    from pathlib import Path

    from dflash_plugin.prompt_io import read_prompts_file
    from dflash_plugin.train.prompts import spread_over_categories

    data = Path(__file__).resolve().parent.parent / "train_data" / "smollm2-135m"
    expected = spread_over_categories(read_jsonl(data / "eval_prompts.jsonl"), 18)
    assert read_jsonl(data / "eval_prompts_18.jsonl") == expected
    # and the bench / dflash generate read it as a prompts file
    assert [r["turns"][0] for r in read_prompts_file(data / "eval_prompts_18.jsonl")] == \
        [p.text for p in expected]
