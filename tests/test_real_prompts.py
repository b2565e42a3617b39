"""The real-source prompt builder (dflash_plugin/train/sources), its checks, the committed
prompt set and the evaluation files. Nothing here downloads: readers run on small files
written into tmp_path, the builder on the generated sources, which need no package."""

import gzip
import json
import random
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest

from dflash_plugin.train.prompts import Prompt, read_jsonl, write_jsonl
from dflash_plugin.train.sources import SOURCE_NAMES, source
from dflash_plugin.train.sources import tasks
from dflash_plugin.train.sources.base import Material
from dflash_plugin.train.sources.builder import BuildReport, load_materials, select_prompts
from dflash_plugin.train.sources.contamination import EvalIndex, find_eval_files
from dflash_plugin.train.sources.dedup import NearDuplicates
from dflash_plugin.train.sources.stage import split_held_out

ROOT = Path(__file__).resolve().parents[1]
EVAL_DIR = ROOT / "train_data" / "eval"
REAL = ROOT / "train_data" / "smollm2-135m-real"
GENERATED = ["arithmetic", "algebra", "reasoning"]


@pytest.fixture(scope="module")
def generated_materials():
    return load_materials(GENERATED, seed=0, fetch=False)


def build(materials, n, seed=0, **kw):
    report = BuildReport(n)
    return select_prompts(materials, n, seed=seed, report=report, **kw), report


# -- builder ----------------------------------------------------------------------------------

def test_builder_is_deterministic_and_seeded(generated_materials):
    a, _ = build(generated_materials, 300)
    b, _ = build(load_materials(GENERATED, seed=0, fetch=False), 300)
    c, _ = build(generated_materials, 300, seed=1)
    assert a == b
    assert [p.text for p in a] != [p.text for p in c]


def test_no_family_above_its_cap_and_sources_share_evenly(generated_materials):
    prompts, report = build(generated_materials, 600)
    assert len(prompts) >= 500
    by_task = Counter(p.task for p in prompts)
    by_source = Counter(p.source for p in prompts)
    assert max(by_task.values()) <= 0.05 * 600
    assert len(by_task) >= 20
    assert max(by_source.values()) <= 600 / 3
    assert report.by_task == dict(sorted(by_task.items()))


def test_followups_come_at_the_asked_rate(generated_materials):
    prompts, report = build(generated_materials, 600, followup_rate=0.15)
    share = sum(p.followup is not None for p in prompts) / len(prompts)
    assert 0.08 <= share <= 0.22
    assert report.followups == sum(p.followup is not None for p in prompts)
    none, _ = build(generated_materials, 200, followup_rate=0.0)
    assert all(p.followup is None for p in none)


def test_prompts_record_source_task_and_category(generated_materials):
    prompts, _ = build(generated_materials, 200)
    for p in prompts:
        assert p.source in GENERATED and p.task.startswith(("math-", "logic-"))
        assert p.category == ("reasoning" if p.source == "reasoning" else "math")
        assert p.id.startswith(p.source + "-")


def test_a_planted_eval_prompt_is_dropped_and_counted(generated_materials):
    clean, _ = build(generated_materials, 200)
    planted = clean[17].text
    index = EvalIndex(["an unrelated evaluation question about rivers", planted])
    kept, report = build(generated_materials, 200, eval_index=index)
    assert planted not in {p.text for p in kept}
    assert report.contaminated + report.resembling_eval >= 1
    assert not any(index.hits(p.text) for p in kept)


def test_eval_index_finds_shared_8grams_only():
    index = EvalIndex(["Please explain why the sky looks blue on a clear summer day"])
    assert index.hits("So, please explain why the sky looks blue on a clear summer day, thanks")
    assert not index.hits("Why is the sky blue? Explain it simply.")
    assert index.shared("x please explain why the sky looks blue on") == [
        "please explain why the sky looks blue on"]


def test_minhash_finds_a_planted_near_duplicate():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(500)]
    base = " ".join(rng.choice(vocab) for _ in range(120))
    near = NearDuplicates()
    assert near.add(base)
    words = base.split()
    words[60] = "changed"
    assert not near.add(" ".join(words))          # one word of 120 differs
    assert near.add(" ".join(rng.choice(vocab) for _ in range(120)))   # unrelated


def test_unknown_source_is_a_clear_error():
    from dflash_plugin.errors import DFlashError
    from dflash_plugin.train.sources.builder import build_real_prompts

    with pytest.raises(DFlashError, match="unknown prompt source"):
        build_real_prompts(10, sources=["wordnet", "nosuch"], fetch=False)


def test_missing_package_is_skipped_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_SOURCES", str(tmp_path))
    report = BuildReport(10)
    found = load_materials(["devil", "algebra"], seed=0, fetch=False, report=report)
    assert list(found) == ["algebra"]
    assert "dict-devil" in report.skipped_sources["devil"]


def test_held_out_split_drops_training_prompts_on_the_same_passage():
    passage = " ".join(f"word{i}" for i in range(60))
    prompts = [Prompt("a", "extraction", f"Summarise this:\n\n{passage}"),
               Prompt("b", "extraction", f"Rewrite this in modern English:\n\n{passage}"),
               *[Prompt(f"c{i}", "math", f"What is {i} plus {i + 1}?") for i in range(5)]]
    train, held, dropped = split_held_out(prompts, 1, seed=0)
    assert len(held) == 2 and dropped == 1
    assert {p.id for p in train} == {f"c{i}" for i in range(5)} - {p.id for p in held}


def test_prompt_files_keep_the_new_fields_and_read_back_gzipped(tmp_path):
    prompts = [Prompt("x-1", "math", "2+2?", source="algebra", task="math-linear",
                      followup="why?"), Prompt("x-2", "chat", "hi")]
    write_jsonl(tmp_path / "p.jsonl.gz", prompts)
    write_jsonl(tmp_path / "p.jsonl", prompts)
    assert read_jsonl(tmp_path / "p.jsonl.gz") == prompts == read_jsonl(tmp_path / "p.jsonl")
    assert gzip.open(tmp_path / "p.jsonl.gz").read() == (tmp_path / "p.jsonl").read_bytes()


# -- task families --------------------------------------------------------------------------

SAMPLE_FIELDS = {
    "word": {"word": "ferry", "pos": "noun", "gloss": "a boat"},
    "word_pair": {"a": "violin", "b": "viola"},
    "topic": {"thing": "glacier", "field": "natural phenomena", "gloss": "ice"},
    "object": {"thing": "kettle"},
    "odd_one_out": {"items": "cat, dog, horse, spoon"},
    "hobby": {"activity": "archery", "gloss": "shooting"},
    "dish": {"dish": "pilaf", "gloss": "rice"},
    "role": {"role": "blacksmith", "gloss": "smith"},
    "country": {"country": "Peru", "capital": "Lima"},
    "city_pair": {"a": "Oslo, Norway", "b": "Lima, Peru", "lat_a": "59.9", "lon_a": "10.7",
                  "lat_b": "-12.0", "lon_b": "-77.0"},
    "story_passage": {"passage": "It was a fine day.", "work": "Emma", "title": "Emma"},
    "old_text_passage": {"passage": "We the People.", "work": "a charter", "title": "x"},
    "tech_passage": {"passage": "The function returns.", "domain": "Python", "work": "docs",
                     "topic": "json"},
    "tech_topic": {"topic": "generators", "domain": "Python", "work": "docs"},
    "man_topic": {"name": "socket", "section": "7", "summary": "Linux socket interface",
                  "domain": "Linux"},
    "c_function": {"name": "qsort", "section": "3", "summary": "sort an array", "domain": "C"},
    "command": {"name": "git-branch", "section": "1", "summary": "List, create, or delete "
                "branches", "domain": "git"},
    "question": {"question": "How do I sort a list?", "domain": "Python", "answer": "sorted"},
    "term": {"term": "cruft", "definition": "junk", "domain": "hacker slang"},
    "satire": {"term": "bore", "definition": "BORE, n. A person who talks."},
    "acronym": {"acronym": "DNS", "expansion": "Domain Name System"},
    "code": {"code": "print(1)", "lang": "python", "domain": "Python", "topic": "x"},
    "function": {"code": "def f(x):\n    return x", "lang": "python", "name": "f",
                 "domain": "Python", "topic": "f in m"},
    "buggy_code": {"code": "def f(x):\n    return x", "lang": "python", "name": "f",
                   "domain": "Python", "topic": "f in m"},
    "spec": {"name": "f", "args": "x", "doc": "Return x doubled.", "lang": "python",
             "domain": "Python"},
    "output_code": {"code": "func ExampleF() {}", "lang": "go", "topic": "fmt"},
    "rust_error": {"code": "fn main() {}", "lang": "rust", "error": "E0382"},
}
CATEGORIES = {"chat", "writing", "coding", "math", "reasoning", "extraction", "stem",
              "humanities", "roleplay"}


def test_every_phrasing_of_every_family_fills_from_its_kinds():
    assert len({f.name for f in tasks.FAMILIES}) == len(tasks.FAMILIES)
    for family in tasks.FAMILIES:
        assert len(family.phrasings) >= 3, family.name
        for kind in family.kinds:
            values = dict(SAMPLE_FIELDS[kind])
            for phrasing in family.phrasings:
                rng = random.Random(0)
                fam = tasks.Family(family.name, family.category, family.kinds, (phrasing,),
                                   family.followups)
                text, category, _ = tasks.fill(fam, values, rng, 0.0)
                assert "{" not in text.replace("{}", "") or "```" in text, (family.name, text)
                assert category in CATEGORIES


def test_roughening_keeps_placeholders_intact():
    rng = random.Random(3)
    for _ in range(500):
        out = tasks.roughen("Please summarise this passage from {work}:\n\n{passage}", rng)
        assert "{work}" in out and out.endswith("{passage}")


# -- readers, on small files ---------------------------------------------------------------

def test_wordnet_reader(tmp_path):
    from dflash_plugin.train.sources import wordnet

    wn = tmp_path / "usr/share/wordnet"
    wn.mkdir(parents=True)
    (wn / "data.noun").write_text(
        "  1 licence header line\n"
        "00000010 05 n 01 animal 0 003 ~ 00000020 n 0000 ~ 00000030 n 0000 ~ 00000040 n 0000 "
        "| a living organism  \n"
        "00000020 05 n 01 dog 0 001 @ 00000010 n 0000 | a domesticated canine; \"the dog "
        "barked\"  \n"
        "00000030 05 n 02 cat 0 true_cat 0 001 @ 00000010 n 0000 | a feline mammal  \n"
        "00000040 05 n 01 horse 0 001 @ 00000010 n 0000 | a hoofed mammal  \n"
        "00000050 06 n 01 spoon 0 000 | a cutlery item  \n")
    (wn / "index.noun").write_text(
        "  1 licence\n"
        "animal n 1 1 ~ 1 1 00000010  \ndog n 1 1 @ 1 1 00000020  \n"
        "cat n 1 1 @ 1 1 00000030  \nhorse n 1 1 @ 1 1 00000040  \nspoon n 1 0 1 1 00000050  \n")
    for pos in ("verb", "adj"):
        (wn / f"data.{pos}").write_text("")
        (wn / f"index.{pos}").write_text("")
    found = wordnet.materials(tmp_path, random.Random(0))
    words = {m.fields["word"]: m.fields["gloss"] for m in found if m.kind == "word"}
    assert words["dog"] == "a domesticated canine"
    assert {"animal", "dog", "cat", "horse", "spoon"} <= set(words)
    odd = [m for m in found if m.kind == "odd_one_out"]
    assert odd and "spoon" in odd[0].fields["items"]
    assert {m.fields["thing"] for m in found if m.kind == "object"} == {"spoon"}


def _r_character_vector(lines):
    blob = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    blob += struct.pack(">ii", 16, len(lines))
    for line in lines:
        raw = line.encode()
        blob += struct.pack(">ii", 0x00040009, len(raw)) + raw
    return blob


def test_austen_reader_decodes_the_r_lazy_load_database(tmp_path):
    from dflash_plugin.train.sources import austen

    paragraph = ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and "
                 "happy disposition, seemed to unite some of the best blessings of existence.")
    lines = ["EMMA", "", "CHAPTER I", ""] + [paragraph, ""] * 12
    blob = _r_character_vector(lines)
    data = tmp_path / "usr/lib/R/site-library/janeaustenr/data"
    data.mkdir(parents=True)
    (data / "Rdata.rdb").write_bytes(struct.pack(">I", len(blob)) + zlib.compress(blob))
    found = austen.materials(tmp_path, random.Random(0))
    assert found and all(m.kind == "story_passage" for m in found)
    assert found[0].fields["title"] == "Emma"
    assert found[0].fields["passage"].startswith("Emma Woodhouse")


def test_dictd_reader_and_devil(tmp_path):
    from dflash_plugin.train.sources import devil

    d = tmp_path / "usr/share/dictd"
    d.mkdir(parents=True)
    entry = b"BORE, n.  A person who talks when you wish him to listen.\n\n"
    head = b"00-database-short\n"
    body = head + entry
    with gzip.open(d / "devil.dict.dz", "wb") as f:
        f.write(body)
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    (d / "devil.index").write_text(f"00-database-short\tA\t{b64[len(head)]}\n"
                                   f"bore\t{b64[len(head)]}\t{b64[len(entry)]}\n")
    found = devil.materials(tmp_path, random.Random(0))
    assert [m.fields["term"] for m in found] == ["bore"]
    assert "wish him to listen" in found[0].fields["definition"]


def test_roff_rst_and_markdown_sections():
    from dflash_plugin.train.sources.docs import markdown_sections, rst_sections
    from dflash_plugin.train.sources.text import roff_sections

    roff = (".TH X 3\n.SH NAME\nqsort \\- sort an array\n.SH DESCRIPTION\nThe \\fBqsort\\fP()"
            " function sorts.\n.SH EXAMPLES\n.EX\nint main(void) {\n    return 0;\n}\n.EE\n")
    blocks = roff_sections(roff)
    assert ("NAME", "qsort - sort an array", False) in blocks
    assert ("DESCRIPTION", "The qsort() function sorts.", False) in blocks
    assert ("EXAMPLES", "int main(void) {\n    return 0;\n}", True) in blocks

    rst = ("Title\n=====\n\nUse :func:`json.dumps` to encode::\n\n    >>> json.dumps(1)\n"
           "    '1'\n\nSecond\n------\n\nMore text here.\n")
    sections = rst_sections(rst)
    assert [s.title for s in sections] == ["Title", "Second"]
    assert sections[0].prose == ["Use json.dumps to encode:"]
    assert sections[0].code == [">>> json.dumps(1)\n'1'"]

    md = "# Error\n\nSome [link](x) text.\n\n```rust\nfn main() {}\n```\n"
    (sec,) = markdown_sections(md)
    assert sec.title == "Error" and sec.prose == ["Some link text."]
    assert sec.code == ["fn main() {}"]


def test_python_functions_get_a_planted_bug_and_a_spec(tmp_path):
    from dflash_plugin.train.sources.pycode import function_materials

    (tmp_path / "m.py").write_text(
        "def clamp(x, lo, hi):\n"
        "    \"\"\"Return x limited to the closed range from lo to hi inclusive.\"\"\"\n"
        "    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n")
    found = {m.kind: m for m in function_materials(tmp_path / "m.py", key="t", domain="Python",
                                                    rng=random.Random(0))}
    assert set(found) == {"function", "buggy_code", "spec"}
    assert '"""' not in found["function"].fields["code"]
    assert found["buggy_code"].fields["code"] != found["function"].fields["code"]
    compile(found["buggy_code"].fields["code"], "bug", "exec")
    assert found["spec"].fields["args"] == "x, lo, hi"


def test_generated_sources_need_no_package():
    for name in GENERATED:
        info, materials = source(name)
        assert info.package == "generated"
        found = materials(None, random.Random(0))
        assert len(found) > 1000 and all(m.kind == "ready" for m in found)


def test_every_source_is_registered_with_a_licence():
    assert len(SOURCE_NAMES) >= 20
    for name in SOURCE_NAMES:
        info, _ = source(name)
        assert info.name == name and info.package and info.licence


def test_fetch_uses_the_cache_marker(tmp_path):
    from dflash_plugin.train.sources.fetch import cached_package

    assert cached_package("wordnet-base", tmp_path) is None
    (tmp_path / "wordnet-base").mkdir()
    (tmp_path / "wordnet-base/.dflash-package.json").write_text(
        json.dumps({"package": "wordnet-base", "version": "1:3.0-37"}))
    pkg = cached_package("wordnet-base", tmp_path)
    assert pkg.version == "1:3.0-37" and pkg.root == tmp_path / "wordnet-base"


# -- evaluation files and the committed set --------------------------------------------------

def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_out_of_distribution_eval_file_is_well_formed():
    rows = _rows(EVAL_DIR / "ood_user_prompts.jsonl")
    assert len(rows) >= 80
    assert all(set(r) == {"id", "category", "text"} and r["text"].strip() for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    counts = Counter(r["category"] for r in rows)
    assert len(counts) >= 8 and min(counts.values()) >= 10


def test_humaneval_eval_file_is_well_formed():
    rows = _rows(EVAL_DIR / "humaneval_prompts.jsonl")
    assert len(rows) == 164
    assert all(r["category"] == "coding" and "```python\n" in r["text"] and "def " in r["text"]
               for r in rows)


def test_eval_files_are_found_and_training_splits_are_not(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("eval_prompts.jsonl", "prompts_train.jsonl", "train_prompts.jsonl",
                 "bench_prompts.jsonl"):
        (tmp_path / "a" / name).write_text("{}\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv/eval_prompts.jsonl").write_text("{}\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b/prompts_eval.jsonl").write_text(
        json.dumps({"id": "x", "prompt": "p", "source": "devil", "task": "satire-write"}) + "\n")
    found = {p.name for p in find_eval_files(tmp_path)}
    assert found == {"eval_prompts.jsonl", "bench_prompts.jsonl"}   # not the builder's split
    assert find_eval_files(tmp_path, exclude=(tmp_path / "a",)) == []
    repo = {p.relative_to(ROOT).as_posix() for p in find_eval_files(ROOT)}
    assert {"train_data/eval/ood_user_prompts.jsonl",
            "train_data/eval/humaneval_prompts.jsonl"} <= repo


@pytest.fixture(scope="module")
def committed():
    path = REAL / "prompts.jsonl.gz"
    if not path.is_file():
        pytest.skip("train_data/smollm2-135m-real/prompts.jsonl.gz not built")
    return read_jsonl(path)


def test_committed_set_meets_its_targets(committed):
    n = len(committed)
    assert n >= 30_000
    assert len({p.id for p in committed}) == n
    assert len({" ".join(p.text.lower().split()) for p in committed}) == n
    assert max(Counter(p.source for p in committed).values()) <= 0.05 * n
    assert max(Counter(p.task for p in committed).values()) <= 0.05 * n
    assert 0.10 <= sum(p.followup is not None for p in committed) / n <= 0.20
    assert len({p.category for p in committed}) >= 8


def test_committed_set_shares_no_8gram_with_any_eval_file(committed):
    held_out = REAL / "eval_prompts.jsonl"
    files = [f for f in find_eval_files(ROOT) if f.resolve() != held_out.resolve()]
    index = EvalIndex.from_files(files)
    assert not [p.id for p in committed if index.hits(p.text)]
    report = json.loads((REAL / "prompts_report.json").read_text())
    assert report["eval_overlaps_remaining"] == 0
    assert report["train_prompts"] == len(committed)


# -- answers with a follow-up turn ---------------------------------------------------------

def test_responses_ask_the_followup_on_the_targets_own_answer(tmp_path):
    from transformers import AutoTokenizer

    from dflash_plugin.prompt_io import encode_chat
    from dflash_plugin.target import resolve_target
    from dflash_plugin.train.responses import FOLLOWUP_SUFFIX, generate_responses

    target = resolve_target(None)
    prompts = [Prompt("p1", "math", "What is 2 + 2?", source="algebra", task="math-linear",
                      followup="Why?"),
               Prompt("p2", "chat", "Say hello.", source="wordnet", task="hobby-start")]
    out = tmp_path / "responses.jsonl"
    stats = generate_responses(target, prompts, out, max_tokens=6, engine="hf", chunk=8)
    rows = {r["id"]: r for r in _rows(out)}
    assert set(rows) == {"p1", "p2", "p1" + FOLLOWUP_SUFFIX}
    assert stats["prompts"] == 2 and stats["followups"] == 1
    second = rows["p1" + FOLLOWUP_SUFFIX]
    assert second["turn"] == 2 and second["prompt"] == "Why?" and second["response_ids"]
    tok = AutoTokenizer.from_pretrained(str(target))
    # every record says how its answer ended: at EOS, else at the 6-token cap
    for row in rows.values():
        ids = row["response_ids"]
        assert row["end"] == ("eos" if ids[-1] == tok.eos_token_id else "cap"), row
        assert row["end"] == "eos" or len(ids) == 6
    first_answer = tok.decode(rows["p1"]["response_ids"], skip_special_tokens=True)
    assert second["prompt_ids"] == encode_chat(tok, [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": "Why?"}])
    # resumable: a second call answers nothing again
    assert generate_responses(target, prompts, out, max_tokens=6, engine="hf")["prompts"] == 0
    assert len(_rows(out)) == 3


# -- the CLI's prompts stage ----------------------------------------------------------------

def test_cli_prompts_stage_builds_the_real_set_by_default(tmp_path, capsys):
    import dflash_cli.main as cli

    work = tmp_path / "work"
    assert cli.main(["train", "--workdir", str(work), "--stages", "prompts",
                     "--prompt-sources", "arithmetic,reasoning", "--num-prompts", "120",
                     "--eval-per-category", "3"]) == 0
    train = read_jsonl(work / "prompts_train.jsonl")
    held = read_jsonl(work / "prompts_eval.jsonl")
    assert len(held) == 6 and len(train) >= 80
    assert {p.source for p in train} == {"arithmetic", "reasoning"}
    report = json.loads((work / "prompts_report.json").read_text())
    assert report["train_prompts"] == len(train) and report["eval_overlaps_remaining"] == 0
    assert "held out" in capsys.readouterr().out


def test_cli_refuses_an_unknown_prompt_source(tmp_path, capsys):
    import dflash_cli.main as cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--workdir", str(tmp_path), "--stages", "prompts",
                  "--prompt-sources", "wordnet,nosuch"])
    assert "unknown prompt source" in capsys.readouterr().err


def test_cli_templates_generator_still_works(tmp_path):
    import dflash_cli.main as cli

    assert cli.main(["train", "--workdir", str(tmp_path), "--stages", "prompts",
                     "--prompt-generator", "templates", "--per-category", "4",
                     "--eval-per-category", "1"]) == 0
    assert len(read_jsonl(tmp_path / "prompts_eval.jsonl")) == 9


def test_eval_files_read_as_prompts_and_a_bad_row_is_a_clear_error(tmp_path):
    from dflash_plugin.errors import DFlashError

    ood = read_jsonl(EVAL_DIR / "ood_user_prompts.jsonl")
    rows = _rows(EVAL_DIR / "ood_user_prompts.jsonl")
    assert [(p.id, p.category, p.text) for p in ood] == [
        (r["id"], r["category"], r["text"]) for r in rows]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "category": "x", "prompt": "hi"}) + "\n"
                   + json.dumps({"id": "b", "category": "x"}) + "\n")
    with pytest.raises(DFlashError, match="line 2"):
        read_jsonl(bad)


def test_committed_data_card_is_what_the_builder_writes():
    """The card is generated (tools/build_real_prompts.py --card-only): a hand edit of the
    README would be lost at the next rebuild, so it belongs in ANSWERS.md or the builder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_real_prompts", REAL.parent.parent / "tools" / "build_real_prompts.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    report = json.loads((REAL / "prompts_report.json").read_text())
    card = (REAL / "README.md").read_text()
    assert builder.render_card(report, REAL) == card
    assert (REAL / "ANSWERS.md").read_text().strip() in card
