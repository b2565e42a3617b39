"""sglang_ext.server_args and sglang_ext.versions without SGLang: the translation of
`dflash serve --engine sglang` flags, where the SGLang interpreter is found, version checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dflash_plugin.errors import DFlashError
from sglang_ext import server_args, versions
from sglang_ext.server_args import build_launch_command, sglang_server_args

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DFLASH = {"model_path": "Qwen/Qwen3-8B", "speculative_algorithm": "DFLASH",
          "speculative_draft_model_path": "z-lab/Qwen3-8B-DFlash-b16"}


def option(args, name):
    return args[args.index(name) + 1]


def test_flags_become_sglang_arguments():
    args = sglang_server_args({**DFLASH, "speculative_num_draft_tokens": 16, "port": 30000,
                               "host": "0.0.0.0", "dtype": "bfloat16", "context_length": 4096,
                               "mem_fraction_static": 0.75, "tp_size": 1,
                               "served_model_name": "qwen", "trust_remote_code": True})
    assert args[:2] == ["--model-path", "Qwen/Qwen3-8B"]
    assert option(args, "--speculative-algorithm") == "DFLASH"
    assert option(args, "--speculative-draft-model-path") == "z-lab/Qwen3-8B-DFlash-b16"
    assert option(args, "--speculative-num-draft-tokens") == "16"  # anchor included, as in SGLang
    assert (option(args, "--port"), option(args, "--host")) == ("30000", "0.0.0.0")
    assert option(args, "--context-length") == "4096"
    assert option(args, "--mem-fraction-static") == "0.75"
    assert args[-1] == "--trust-remote-code"


def test_dashed_keys_lowercase_algorithm_and_unset_values():
    args = sglang_server_args({"model-path": "m", "speculative-algorithm": "dflash",
                               "speculative-draft-model-path": "d", "port": None,
                               "trust_remote_code": False})
    assert args == ["--model-path", "m", "--speculative-algorithm", "DFLASH",
                    "--speculative-draft-model-path", "d"]


def test_vllm_backend_names_become_sglang_names():
    args = sglang_server_args({**DFLASH, "attention_backend": "FLASHINFER",
                               "speculative_draft_attention_backend": "FLASH_ATTN"})
    assert option(args, "--attention-backend") == "flashinfer"
    assert option(args, "--speculative-draft-attention-backend") == "fa3"


def test_passthrough_comes_last_so_it_wins():
    args = sglang_server_args({**DFLASH, "port": 1}, ["--port", "2", "--disable-radix-cache"])
    assert args[-3:] == ["--port", "2", "--disable-radix-cache"]


def test_none_drops_speculation_and_ngram_passes():
    args = sglang_server_args({**DFLASH, "speculative_algorithm": "NONE",
                               "speculative_num_draft_tokens": 16})
    assert not [a for a in args if a.startswith("--speculative")]
    args = sglang_server_args({"model_path": "m", "speculative_algorithm": "NGRAM",
                               "speculative_num_draft_tokens": 5})
    assert option(args, "--speculative-algorithm") == "NGRAM"


@pytest.mark.parametrize("flags, message", [
    ({"speculative_algorithm": "DFLASH"}, "needs --model-path"),
    ({"model_path": "m", "speculative_algorithm": "DFLASH"}, "needs --speculative-draft-model"),
    ({**DFLASH, "speculative_num_draft_tokens": 1}, "must be >= 2"),
    ({**DFLASH, "speculative_algorithm": "EAGLE9"}, "choose from DFLASH, NGRAM, NONE"),
    ({**DFLASH, "max_num_seqs": 8}, "unknown flag --max-num-seqs"),
])
def test_bad_flags_are_refused_with_the_flag_named(flags, message):
    with pytest.raises(DFlashError, match=message):
        sglang_server_args(flags)


def test_launch_command_runs_the_checking_launcher_in_the_sglang_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("DFLASH_SGLANG_VENV", str(venv))
    argv = build_launch_command(DFLASH, ["--log-level", "debug"])
    assert argv[:3] == [str(venv / "bin" / "python"), "-m", "sglang_ext.launch_server"]
    assert argv[-2:] == ["--log-level", "debug"]


def test_missing_sglang_environment_is_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_SGLANG_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(DFlashError, match="scripts/setup_sglang_env.sh"):
        build_launch_command(DFLASH, [])


def test_the_default_environment_is_next_to_the_package():
    repo = Path(server_args.__file__).resolve().parents[1]
    assert server_args.DEFAULT_VENV == repo / ".venv-sglang"


@pytest.mark.parametrize("version, ok", [("0.5.23", True), ("0.5.23.post1", True),
                                         ("0.5.22", False), ("0.5.24", False), ("0.6.0", False),
                                         ("not-a-version", False)])
def test_supported_versions(version, ok):
    assert versions.is_supported(version) is ok


def test_version_errors_name_the_range_and_the_fix(monkeypatch):
    monkeypatch.delenv("DFLASH_SGLANG_ALLOW_UNTESTED", raising=False)
    with pytest.raises(versions.SGLangVersionError) as err:
        versions.check_sglang_version("0.5.15")
    assert "0.5.15" in str(err.value) and ">=0.5.23" in str(err.value)
    assert "setup_sglang_env.sh" in str(err.value)
    monkeypatch.setattr(versions, "installed_sglang_version", lambda: None)
    with pytest.raises(versions.SGLangVersionError, match="SGLang is not installed"):
        versions.check_sglang_version()
    monkeypatch.setenv("DFLASH_SGLANG_ALLOW_UNTESTED", "1")
    assert versions.check_sglang_version("0.6.0") == "0.6.0"


@pytest.mark.parametrize("name", ["sglang-qwen3-8b-dflash.yaml", "sglang-llama3.1-8b-dflash.yaml"])
def test_shipped_sglang_configs_translate(name):
    from dflash_cli.serving import flags

    opts = flags.options_from_args(argparse.Namespace(config=str(CONFIGS / name)))
    assert opts.engine == "sglang"
    args = sglang_server_args(flags.sglang_flags(opts), opts.engine_args)
    assert option(args, "--speculative-algorithm") == "DFLASH"
    assert option(args, "--speculative-draft-model-path").startswith("z-lab/")
    assert option(args, "--speculative-draft-attention-backend") == "flashinfer"
