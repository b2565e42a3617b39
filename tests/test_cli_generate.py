"""`dflash generate --prompts-file ... --output ...` end to end (in process), with a random
drafter saved to disk: the JSON lines have the documented keys, and speculative output is
token-identical to --no-speculation output in float32."""

import json

import pytest
import torch
from core_helpers import make_drafter

import dflash_cli.main as cli
from dflash_plugin.checkpoint import save_drafter

pytestmark = pytest.mark.slow

KEYS = {"prompt", "text", "token_ids", "num_target_passes", "mean_accept_length", "wall_s",
        "tokens_per_s", "finish_reason"}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, target_f32):
    path = tmp_path_factory.mktemp("drafter") / "random-b8"
    save_drafter(make_drafter(target_f32, block_size=8, seed=1), path, dtype=torch.float32)
    return path


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "What is the capital of France?"}) + "\n"
                    + json.dumps({"turns": ["Name a fruit.", "Now name a vegetable."]}) + "\n")
    return path


@pytest.fixture()
def shared_target(monkeypatch, smollm_f32):
    """Reuse the session's float32 target instead of loading it again for every command."""
    import dflash_plugin.target

    def load_target(path=None, dtype=torch.bfloat16):
        assert path is None and dtype == torch.float32
        return smollm_f32
    monkeypatch.setattr(dflash_plugin.target, "load_target", load_target)


def run_generate(tmp_path, prompts_file, *flags):
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.jsonl"
    code = cli.main(["generate", "--prompts-file", str(prompts_file), "--output", str(out),
                     "--dtype", "float32", "--max-new-tokens", "12", *flags])
    assert code == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_generate_writes_json_lines_and_matches_plain(tmp_path, prompts_file, draft_dir,
                                                     shared_target, tokenizer, capsys):
    spec = run_generate(tmp_path, prompts_file, "--draft", str(draft_dir), "--compare")
    plain = run_generate(tmp_path, prompts_file, "--no-speculation")
    assert capsys.readouterr().out == ""  # everything went to --output

    assert len(spec) == len(plain) == 2
    assert spec[0]["prompt"] == "What is the capital of France?"
    assert spec[1]["prompt"] == ["Name a fruit.", "Now name a vegetable."]
    for row in spec + plain:
        assert KEYS <= set(row)
        assert row["token_ids"] and all(isinstance(t, int) for t in row["token_ids"])
        assert row["text"] == tokenizer.decode(row["token_ids"], skip_special_tokens=True)
        assert row["num_target_passes"] >= 1 and row["mean_accept_length"] >= 1.0
        assert row["wall_s"] > 0 and row["tokens_per_s"] > 0
    # two turns: the merged row holds both answers, each at most 12 tokens
    assert len(spec[1]["token_ids"]) <= 24 and spec[1]["num_target_passes"] >= 2

    for s, p in zip(spec, plain):
        assert s["token_ids"] == p["token_ids"]
        assert s["identical_to_baseline"] is True and "speedup" in s
        assert p["mean_accept_length"] == 1.0
        assert p["num_target_passes"] == len(p["token_ids"])  # one pass per token


@pytest.mark.parametrize("cpu_default, expected", [("float32", torch.float32), (None, torch.bfloat16)])
def test_generate_dtype_defaults_to_float32_on_cpus_without_native_bf16(
        monkeypatch, tmp_path, prompts_file, smollm_f32, cpu_default, expected):
    import dflash_cli.commands.generate as generate_command
    import dflash_plugin.target

    seen = []

    def load_target(path=None, dtype=None):
        seen.append(dtype)
        return smollm_f32
    monkeypatch.setattr(dflash_plugin.target, "load_target", load_target)
    monkeypatch.setattr(generate_command, "default_cpu_dtype", lambda: cpu_default)
    out = tmp_path / "out.jsonl"
    assert cli.main(["generate", "--prompts-file", str(prompts_file), "--output", str(out),
                     "--no-speculation", "--max-new-tokens", "2"]) == 0
    assert seen == [expected] and out.read_text()


def test_datastore_drafts_with_lookup_trees_only_and_from_files_that_exist(
        tmp_path, prompts_file, draft_dir, shared_target, capsys):
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"response_ids": [1, 2, 3, 4, 5]}) + "\n")
    common = ["generate", "--prompts-file", str(prompts_file), "--output", str(tmp_path / "o"),
              "--dtype", "float32", "--max-new-tokens", "4", "--draft", str(draft_dir)]
    assert cli.main(common + ["--datastore", str(answers)]) == 2
    assert "LOOKUP_TREE" in capsys.readouterr().err
    assert cli.main(common + ["--speculative-algorithm", "LOOKUP_TREE",
                              "--datastore", str(tmp_path / "none.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    plain = run_generate(tmp_path, prompts_file, "--no-speculation")
    spec = run_generate(tmp_path, prompts_file, "--draft", str(draft_dir), "--speculative-algorithm",
                        "LOOKUP_TREE", "--tree-budget", "2", "--datastore", str(answers))
    assert [r["token_ids"] for r in spec] == [r["token_ids"] for r in plain]
