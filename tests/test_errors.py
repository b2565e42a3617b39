"""Bad input fails early with an error that names the problem."""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dflash_cli.main as cli
from dflash_plugin.config import make_config
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.errors import DFlashError, MismatchError
from dflash_plugin.generate import SpecDecoder, generate_plain
from dflash_plugin.sampling import SamplingParams


def drafter_for(target_config, **config_changes):
    config = make_config(target_config, num_draft_layers=1, block_size=4, mask_token_id=3)
    for key, value in config_changes.items():
        setattr(config, key, value)
    return DFlashDraftModel(config).eval()


# ---- drafter / target pairing (SmolLM2: 30 layers, hidden 576, vocab 49152) -----------------

def test_vocab_mismatch(target_f32):
    drafter = drafter_for(target_f32.config, vocab_size=32000)
    with pytest.raises(MismatchError, match="vocab size 32000 differs from the target's 49152"):
        SpecDecoder(target_f32, drafter)


def test_hidden_size_mismatch(target_f32):
    other = copy.deepcopy(target_f32.config)
    other.hidden_size, other.head_dim = 512, 64
    other.num_attention_heads, other.num_key_value_heads = 8, 2
    drafter = drafter_for(other)
    with pytest.raises(MismatchError, match="hidden size 512.*576"):
        SpecDecoder(target_f32, drafter)


def test_drafter_hidden_differs_from_target_features(target_f32):
    """Features sized for this target, but the drafter's own width differs."""
    drafter = drafter_for(target_f32.config, hidden_size=512, head_dim=64,
                          num_attention_heads=8, num_key_value_heads=2, target_hidden_size=576)
    with pytest.raises(MismatchError, match="drafter hidden size 512 differs"):
        SpecDecoder(target_f32, drafter)


def test_target_layer_ids_beyond_target(target_f32):
    config = make_config(target_f32.config, num_draft_layers=1, block_size=4, mask_token_id=3,
                         target_layer_ids=[1, 29, 33])
    with pytest.raises(MismatchError,
                       match=r"target_layer_ids \[1, 29, 33\] include \[33\].*30 layers"):
        SpecDecoder(target_f32, DFlashDraftModel(config))


def test_drafter_for_a_deeper_target(target_f32):
    """Same width and vocabulary, but made for a 36-layer target: its layer ids ([18]) fit, yet
    its features would come from the wrong depths."""
    other = copy.deepcopy(target_f32.config)
    other.num_hidden_layers = 36
    drafter = drafter_for(other)
    assert drafter.fields.target_layer_ids == (18,)
    with pytest.raises(MismatchError,
                       match="trained for a target with 36 layers, the target has 30"):
        SpecDecoder(target_f32, drafter)


def test_mask_token_outside_vocab(target_f32):
    drafter = drafter_for(target_f32.config, dflash_config={"mask_token_id": 60000,
                                                          "target_layer_ids": [1, 27]})
    with pytest.raises(MismatchError, match="mask_token_id 60000"):
        SpecDecoder(target_f32, drafter)


def test_block_size_too_small(target_f32, drafter_f32):
    with pytest.raises(DFlashError, match="block size must be >= 2"):
        SpecDecoder(target_f32, drafter_f32, block_size=1)


# ---- requests -------------------------------------------------------------------------------

def test_over_long_prompt(target_f32, drafter_f32):
    limit = target_f32.config.max_position_embeddings  # 8192
    ids = torch.full((1, limit - 10), 100)
    decoder = SpecDecoder(target_f32, drafter_f32)
    for run in (lambda n: decoder.generate(ids, n), lambda n: generate_plain(target_f32, ids, n)):
        with pytest.raises(DFlashError, match=f"exceeds the target's context of {limit}"):
            run(11)


def test_bad_request_shapes_and_lengths(target_f32, drafter_f32):
    decoder = SpecDecoder(target_f32, drafter_f32)
    with pytest.raises(DFlashError, match="shape"):
        decoder.generate(torch.ones(2, 5, dtype=torch.long), 4)
    with pytest.raises(DFlashError, match="shape"):
        generate_plain(target_f32, torch.ones(5, dtype=torch.long), 4)
    with pytest.raises(DFlashError, match="max_new_tokens"):
        decoder.generate(torch.ones(1, 5, dtype=torch.long), 0)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": -1}, "top_k"),
])
def test_bad_sampling_values(kwargs, fragment):
    with pytest.raises(DFlashError, match=fragment):
        SamplingParams(**kwargs)


# ---- command line ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--speculative-algorithm", "FOO"], "invalid choice: 'FOO'"),
    (["--max-new-tokens", "ten"], "invalid int value"),
    ([], "one of the arguments --prompt --prompts-file is required"),
])
def test_cli_rejects_bad_flags(capsys, argv, fragment):
    base = ["generate"] + ([] if argv == [] else ["--prompt", "hi"])
    with pytest.raises(SystemExit) as info:
        cli.main(base + argv)
    assert info.value.code != 0
    assert fragment in capsys.readouterr().err


def test_cli_bad_values_exit_2(capsys, tmp_path):
    assert cli.main(["generate", "--prompt", "hi", "--temperature", "-1"]) == 2
    assert "temperature must be >= 0" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert cli.main(["generate", "--prompts-file", str(empty)]) == 2
    assert "holds no prompts" in capsys.readouterr().err
    for line, fragment in (('["hi"]', "needs a JSON object"), ('{"title": "hi"}', '"prompt" or "text" string'),
                           ("{oops", "not JSON")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "fine"}\n' + line + "\n")
        assert cli.main(["generate", "--prompts-file", str(bad)]) == 2
        assert "bad.jsonl:2: " in (err := capsys.readouterr().err) and fragment in err, err


@pytest.mark.slow
def test_cli_missing_draft_exit_code_2():
    """Through the installed `dflash` script, as a user runs it."""
    dflash = Path(sys.executable).with_name("dflash")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(dflash), "generate", "--prompt", "hi", "--draft", "/nonexistent",
                           "--max-new-tokens", "2"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("dflash generate: error: drafter checkpoint folder /nonexistent does not exist"
            in proc.stderr)


@pytest.mark.slow
def test_cli_draft_for_another_target_exit_code_2(capsys, target_f32, tmp_path):
    from dflash_plugin.checkpoint import save_drafter
    other = copy.deepcopy(target_f32.config)
    other.vocab_size = 1000
    save_drafter(drafter_for(other), tmp_path / "d")
    code = cli.main(["generate", "--prompt", "hi", "--draft", str(tmp_path / "d"),
                     "--dtype", "float32", "--max-new-tokens", "2"])
    assert code == 2
    assert "vocab size 1000 differs" in capsys.readouterr().err

