"""`dflash serve --engine sglang` flags, through sglang_ext.server_args, parsed and resolved by
SGLang's own server-argument code."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

from sglang.srt.arg_groups.overrides import resolving_view  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from sglang_ext.server_args import LAUNCH_MODULE, build_launch_command  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def server_args(flags, passthrough=()):
    argv = build_launch_command(flags, list(passthrough), python="python")
    assert argv[1:3] == ["-m", LAUNCH_MODULE]
    return prepare_server_args(argv[3:])


def dflash_flags(tiny, **extra):
    return {"model_path": str(tiny.target_dir), "speculative_algorithm": "DFLASH",
            "speculative_draft_model_path": str(tiny.drafter_dir), **extra}


def test_sglang_parses_the_translated_flags(tiny):
    args = server_args(dflash_flags(tiny, speculative_num_draft_tokens=4, host="0.0.0.0",
                                    port=30001, dtype="bfloat16", context_length=1024,
                                    mem_fraction_static=0.8, tp_size=1,
                                    attention_backend="FLASHINFER",
                                    speculative_draft_attention_backend="FLASH_ATTN",
                                    served_model_name="tiny", trust_remote_code=True),
                       ["--max-running-requests", "8"])
    assert args.model_path == str(tiny.target_dir)
    assert args.speculative_algorithm == "DFLASH"
    assert args.speculative_draft_model_path == str(tiny.drafter_dir)
    assert args.speculative_num_draft_tokens == 4
    assert (args.host, args.port, args.dtype) == ("0.0.0.0", 30001, "bfloat16")
    assert (args.context_length, args.mem_fraction_static, args.tp_size) == (1024, 0.8, 1)
    assert args.attention_backend == "flashinfer"
    assert args.speculative_draft_attention_backend == "fa3"
    assert args.served_model_name == "tiny" and args.trust_remote_code is True
    assert args.max_running_requests == 8


def test_sglang_resolves_dflash_for_our_checkpoint(tiny, plugins_loaded, monkeypatch):
    """Full resolution (SGLang's `_handle_dflash`) on a CUDA device description: the block size
    comes from our checkpoint's config, the draft backend gets SGLang's default, and DFLASH
    creates SGLang's v2 DFLASH worker, which loads the drafter by architecture name."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_ext.draft_model import DFlashDraftModel

    args = server_args(dflash_flags(tiny, speculative_algorithm="dflash"), ["--device", "cuda"])
    args.resolve_once()
    view = resolving_view(args)
    assert view.speculative_num_draft_tokens == 4  # the drafter's block_size
    assert (view.speculative_num_steps, view.speculative_eagle_topk) == (1, 1)
    # FlashInfer on a CUDA machine; SGLang's non-CUDA fallback (Triton) on this one.
    assert view.speculative_draft_attention_backend in ("flashinfer", "triton")
    algorithm = SpeculativeAlgorithm.from_string(view.speculative_algorithm)
    assert algorithm is SpeculativeAlgorithm.DFLASH
    assert algorithm.create_worker(args) is DFlashWorkerV2
    draft_config = ModelConfig.from_server_args(args, model_path=view.speculative_draft_model_path,
                                                is_draft_model=True)
    monkeypatch.setenv("DFLASH_SGLANG_DRAFTER", "plugin")
    assert get_model_architecture(draft_config)[0] is DFlashDraftModel


def _resolved_draft_class(args):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    args.resolve_once()
    view = resolving_view(args)
    draft_config = ModelConfig.from_server_args(args, model_path=view.speculative_draft_model_path,
                                                is_draft_model=True)
    return get_model_architecture(draft_config)[0]


@pytest.fixture
def plugin_requested(plugins_loaded, monkeypatch):
    """This adapter's drafter asked for; SGLang's runtime context put back afterwards."""
    from sglang.srt import runtime_context

    monkeypatch.setenv("DFLASH_SGLANG_DRAFTER", "plugin")
    monkeypatch.setattr(runtime_context, "_PARALLEL", runtime_context._PARALLEL)
    monkeypatch.setattr(runtime_context, "_CONTEXT", runtime_context._CONTEXT)


def test_tensor_parallel_stays_with_sglangs_own_drafter(tiny, plugin_requested):
    """--tp-size 2 in the server arguments: SGLang's drafter shards its layers, this adapter's
    does not, so SGLang's serves (no refusal), even with the adapter's drafter asked for."""
    from sglang.srt import runtime_context
    from sglang.srt.models import dflash as sglang_dflash

    from sglang_ext.draft_model import DFlashDraftModel

    args = server_args(dflash_flags(tiny, tp_size=2), ["--device", "cuda"])
    args.resolve_once()
    runtime_context.publish(args, role="scheduler")  # what the scheduler process does
    assert runtime_context.get_parallel().tp_size == 2
    assert _resolved_draft_class(args) is sglang_dflash.DFlashDraftModel
    one = server_args(dflash_flags(tiny), ["--device", "cuda"])
    one.resolve_once()
    runtime_context.publish(one, role="scheduler")
    assert _resolved_draft_class(one) is DFlashDraftModel


def test_sliding_window_drafter_stays_with_sglangs_own(tiny, plugin_requested, tmp_path):
    import json
    import shutil

    from sglang.srt.models import dflash as sglang_dflash

    drafter = tmp_path / "sliding"
    shutil.copytree(tiny.drafter_dir, drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["layer_types"] = ["sliding_attention"] * config["num_hidden_layers"]
    config["sliding_window"] = 8
    (drafter / "config.json").write_text(json.dumps(config))
    flags = dflash_flags(tiny, speculative_draft_model_path=str(drafter))
    assert _resolved_draft_class(server_args(flags, ["--device", "cuda"])) \
        is sglang_dflash.DFlashDraftModel
    full_attention = server_args(dflash_flags(tiny), ["--device", "cuda"])
    assert _resolved_draft_class(full_attention) is not sglang_dflash.DFlashDraftModel


def test_quantized_drafter_stays_with_sglangs_own(tiny, plugin_requested):
    from types import SimpleNamespace

    from sglang.srt.models import dflash as sglang_dflash
    from transformers import AutoConfig

    from sglang_ext import registration

    draft = SimpleNamespace(hf_config=AutoConfig.from_pretrained(tiny.drafter_dir),
                            quantization="fp8", model_path=str(tiny.drafter_dir))
    assert registration.native_reasons(draft, tp_size=1) == ["quantization (fp8)"]
    assert registration.choose_draft_model(draft, tp_size=1) is sglang_dflash.DFlashDraftModel


def test_sglang_refuses_dflash_on_cpu(tiny):
    """SGLang 0.5.23's device gate: this is why the CPU tests stop short of a server."""
    args = server_args(dflash_flags(tiny), ["--device", "cpu"])
    with pytest.raises(ValueError, match="DFLASH speculative decoding is not supported"):
        args.resolve_once()


def test_no_speculation_drops_the_speculative_flags(tiny):
    args = server_args({**dflash_flags(tiny), "speculative_algorithm": "NONE"})
    assert args.speculative_algorithm is None and args.speculative_draft_model_path is None


@pytest.mark.parametrize("name", ["sglang-qwen3-8b-dflash.yaml", "sglang-llama3.1-8b-dflash.yaml"])
def test_shipped_configs_parse_in_sglang(name):
    """configs/sglang-*.yaml as `dflash serve --config` reads them, translated, parsed by SGLang
    (no resolution: the public models are not on this machine)."""
    from dflash_cli.serving import flags

    opts = flags.options_from_args(argparse.Namespace(config=str(CONFIGS / name)))
    assert opts.engine == "sglang"
    args = server_args(flags.sglang_flags(opts), opts.engine_args)
    assert args.speculative_algorithm == "DFLASH"
    assert args.speculative_draft_model_path.startswith("z-lab/")
    assert args.speculative_num_draft_tokens == {"sglang-qwen3-8b-dflash.yaml": 16,
                                                 "sglang-llama3.1-8b-dflash.yaml": 10}[name]
    assert args.speculative_draft_attention_backend in ("flashinfer", "fa3", "fa4", "triton")
