"""`dflash serve` / `dflash bench` flag handling, YAML configs and bench arithmetic; no server."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_cli.main import build_parser
from dflash_cli.main import main as cli_main
from dflash_plugin.errors import DFlashError
from dflash_cli.serving import bench, flags

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def parse(*argv):
    return build_parser().parse_args(["serve", *argv])


def options(*argv):
    return flags.options_from_args(parse(*argv))


def launch(*argv):
    return flags.build_launch(flags.resolve(options(*argv)))


def spec_config(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def run_cli(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "dflash_cli.main", *argv], capture_output=True,
                          text=True, timeout=timeout)


def main_in_process(capsys, *argv) -> tuple[int, str]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().err


def test_dflash_flags_become_a_vllm_speculative_config(random_drafter, monkeypatch):
    # bf16: the full block on every CPU (float32 drafts a shorter one on vLLM-CPU, see below)
    result = launch("--speculative-draft-model-path", str(random_drafter), "--port", "8123",
                    "--dtype", "bfloat16", "--context-length", "1024")
    argv = result.argv
    assert argv[1:4] == ["-m", "dflash_cli.serving.vllm_main", "serve"]
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"
    # num_speculative_tokens = block_size - 1 by default
    assert spec_config(argv) == {"method": "dflash", "model": str(random_drafter),
                                 "num_speculative_tokens": 15,
                                 "disable_eagle_block_drop": True}
    assert result.env_defaults["HF_HUB_OFFLINE"] == "1"


def test_num_draft_tokens_counts_the_anchor(random_drafter):
    argv = launch("--speculative-draft-model-path", str(random_drafter),
                  "--speculative-num-draft-tokens", "8").argv
    assert spec_config(argv)["num_speculative_tokens"] == 7


def test_ngram_and_none(random_drafter):
    ngram = spec_config(launch("--speculative-algorithm", "ngram").argv)
    assert ngram["method"] == "ngram" and ngram["num_speculative_tokens"] == 4
    none = launch("--speculative-algorithm", "NONE", "--speculative-draft-model-path",
                  str(random_drafter)).argv
    assert "--speculative-config" not in none


def test_unknown_args_and_args_after_double_dash_pass_through(random_drafter):
    args = parse("--speculative-draft-model-path", str(random_drafter), "--enforce-eager",
                 "--max-num-seqs", "8", "--port", "9000", "--", "--dtype", "float16")
    assert args.engine_args == ["--enforce-eager", "--max-num-seqs", "8", "--dtype", "float16"]
    assert args.port == 9000 and not hasattr(args, "dtype")
    argv = flags.vllm_launch(flags.resolve(flags.options_from_args(args))).argv
    assert argv[-5:] == ["--enforce-eager", "--max-num-seqs", "8", "--dtype", "float16"]


def test_vllm_spellings_are_aliases():
    args = parse("--max-model-len", "512", "--gpu-memory-utilization", "0.4", "--model", "/x")
    assert (args.context_length, args.mem_fraction_static, args.model_path) == (512, 0.4, "/x")


@pytest.mark.parametrize("argv, message", [
    (["--speculative-algorithm", "EAGLE9"], "invalid choice 'EAGLE9'"),
    (["--port", "70000"], "port must be in 1..65535"),
    (["--port", "http"], "expected an integer"),
    (["--speculative-num-draft-tokens", "1"], "must be >= 2"),
    (["--mem-fraction-static", "1.5"], "must be in (0, 1]"),
    (["--dtype", "int3"], "invalid choice 'int3'"),
    (["--engine", "tgi"], "invalid choice 'tgi'"),
])
def test_bad_flag_values_are_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_checkpoint_problems_are_errors_before_start(random_drafter, tmp_path):
    with pytest.raises(DFlashError, match="larger than the drafter's block_size 16"):
        launch("--speculative-draft-model-path", str(random_drafter),
               "--speculative-num-draft-tokens", "17")
    with pytest.raises(DFlashError, match="no config.json"):
        launch("--speculative-draft-model-path", str(tmp_path))
    with pytest.raises(DFlashError, match="not a Hugging Face model folder"):
        launch("--model-path", str(tmp_path), "--speculative-algorithm", "NONE")
    with pytest.raises(DFlashError, match="needs --speculative-draft-model-path"):
        launch("--model-path", str(random_drafter))


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": 151936}, "vocab size 151936 differs from the target's 49152"),
    ({"num_target_layers": 36}, "trained for a target with 36 layers, the target has 30"),
    ({"hidden_size": None}, "config.json lacks or garbles"),
])
def test_a_drafter_that_does_not_fit_the_target_is_refused_before_start(
        random_drafter, tmp_path, change, message):
    config = json.loads((random_drafter / "config.json").read_text())
    for key, value in change.items():
        config.pop(key) if value is None else config.update({key: value})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashError, match=message) as refused:
        launch("--speculative-draft-model-path", str(tmp_path))
    assert f"draft model {tmp_path}" in str(refused.value)


def test_missing_shipped_drafter_is_explained(shipped_drafter, capsys):
    if shipped_drafter is not None:
        pytest.skip("the shipped drafter exists")
    code, err = main_in_process(capsys, "serve", "--print-command")
    assert code == 2
    assert "shipped drafter" in err and "--speculative-draft-model-path" in err


def test_yaml_config_and_precedence(random_drafter, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"""
speculative-draft-model-path: {random_drafter}
port: 8100
dtype: float32
context_length: 1024
engine-args:
  enforce-eager: true
  enable-prefix-caching: false
  max-num-seqs: 4
  compilation-config: {{mode: 0}}
env:
  VLLM_CPU_OMP_THREADS_BIND: "0"
""")
    result = launch("--config", str(config), "--port", "8200", "--", "--seed", "1")
    argv = result.argv
    assert argv[argv.index("--port") + 1] == "8200"  # the command line wins
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[-8:] == ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "4",
                         "--compilation-config", '{"mode": 0}', "--seed", "1"]
    assert result.env == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert result.environ({})["VLLM_CPU_OMP_THREADS_BIND"] == "0"


@pytest.mark.parametrize("text, message", [
    ("speculative-algoritm: DFLASH\n", "unknown key 'speculative-algoritm'"),
    ("port: -3\n", "port: port must be in 1..65535"),
    ("speculative-algorithm: MEDUSA\n", "invalid choice 'MEDUSA'"),
    ("- a\n- b\n", "expected a mapping"),
    ("env: [1]\n", "env must be a mapping"),
    ("port: [\n", "not valid YAML"),
])
def test_bad_yaml_is_a_clear_error(text, message, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options("--config", str(config))


@pytest.mark.parametrize("name", ["vllm-cpu-default.yaml", "vllm-qwen3-8b-dflash.yaml",
                                  "vllm-llama3.1-8b-dflash.yaml"])
def test_shipped_configs_are_valid(name):
    values = flags.load_yaml(CONFIGS / name)
    assert values["engine"] == "vllm" and values["speculative_algorithm"] == "DFLASH"


def test_qwen3_config_translation():
    opts = flags.resolve(options("--config", str(CONFIGS / "vllm-qwen3-8b-dflash.yaml")))
    argv = flags.vllm_launch(opts).argv
    assert argv[4] == "Qwen/Qwen3-8B"
    assert argv[argv.index("--attention-backend") + 1] == "FLASHINFER"
    assert spec_config(argv) == {"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16",
                                 "num_speculative_tokens": 15, "attention_backend": "FLASH_ATTN",
                                 "disable_eagle_block_drop": True}


def test_sglang_engine_calls_the_adapter_or_says_it_is_missing(random_drafter, monkeypatch):
    opts = flags.resolve(options("--engine", "sglang", "--speculative-draft-model-path",
                                 str(random_drafter), "--", "--disable-cuda-graph"))
    try:
        import sglang_ext.server_args  # noqa: F401
    except ImportError:
        with pytest.raises(DFlashError, match="SGLang adapter not available"):
            flags.build_launch(opts)
        return
    calls = []
    monkeypatch.setattr("sglang_ext.server_args.build_launch_command",
                        lambda f, p: calls.append((f, p)) or ["sglang", "serve"])
    assert flags.build_launch(opts).argv == ["sglang", "serve"]
    flag_dict, passthrough = calls[0]
    assert flag_dict["speculative_algorithm"] == "DFLASH"
    assert flag_dict["speculative_num_draft_tokens"] == 16
    assert passthrough == ["--disable-cuda-graph"]


# ---------------------------------------------------------------------------------------------
# bench helpers

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 20.0
"""


def test_metrics_parsing_and_acceptance_length():
    after = bench.parse_counters(METRICS)
    assert after == {"vllm:spec_decode_num_drafts": 10.0, "vllm:spec_decode_num_draft_tokens": 150.0,
                     "vllm:spec_decode_num_accepted_tokens": 25.0}
    before = dict.fromkeys(after, 0.0)
    assert bench.acceptance_length(before, after) == pytest.approx(3.5)
    assert bench.acceptance_length(after, after) is None


def test_summary_rows_speedups_and_plots(tmp_path):
    R = bench.RequestResult
    none = bench.summarize("none", 4, [R(True, 2.0, 0.1, 20), R(True, 2.0, 0.2, 20)], 4.0)
    assert none["output_tokens_per_s"] == 10.0 and none["ttft_ms"] == pytest.approx(150.0)
    assert none["tpot_ms"] == pytest.approx(1000 * (1.9 + 1.8) / 2 / 19, abs=0.01)
    spec = bench.summarize("dflash", 4, [R(True, 1.0, 0.1, 40), R(False, 0.5, error="boom")], 2.0,
                           dict.fromkeys(bench.SPEC_COUNTERS, 0.0), bench.parse_counters(METRICS))
    assert spec["failed"] == 1 and spec["accept_length"] == 3.5 and spec["errors"] == ["boom"]
    rows = bench.add_speedups([none, spec])
    assert rows[1]["speedup"] == 2.0 and rows[0]["speedup"] == 1.0
    for key in ("algorithm", "concurrency", "output_tokens_per_s", "tpot_ms", "ttft_ms",
                "accept_length", "speedup"):
        assert key in rows[0]
    paths = bench.write_plots(rows, tmp_path / "out.json")
    assert [p.name for p in paths] == ["out_throughput.png", "out_speedup.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert "dflash" in bench.format_table(rows)


def test_repeated_runs_keep_each_runs_rate():
    R = bench.RequestResult
    results = [R(True, 1.0, 0.1, 30), R(True, 1.0, 0.1, 10),  # run 1: 40 tokens in 2 s
               R(True, 1.0, 0.1, 30), R(False, 0.5, error="boom")]  # run 2: 30 tokens in 3 s
    assert bench.per_run_rates(results, [2.0, 3.0]) == [20.0, 10.0]
    pooled = bench.summarize("none", 2, results, 5.0)
    assert pooled["output_tokens_per_s"] == 14.0 and pooled["failed"] == 1


def test_builtin_bench_prompts():
    prompts = bench.read_prompts(None)
    assert len(prompts) >= 32 and len(set(prompts)) == len(prompts)


def test_bench_plugin_switch(monkeypatch):
    from dflash_cli.commands.bench import plugin_env
    native = plugin_env("dflash-native", {})["VLLM_PLUGINS"].split(",")
    assert "dflash" not in native
    assert plugin_env("dflash", {}) == {}
    assert plugin_env("dflash-native", {"VLLM_PLUGINS": "dflash,other"}) == {"VLLM_PLUGINS": "other"}
    assert plugin_env("dflash", {"VLLM_PLUGINS": "other"}) == {"VLLM_PLUGINS": "other,dflash"}


def test_bench_plugin_variants_carry_their_own_settings():
    from dflash_cli.commands.bench import Variant, parse_algorithm
    assert parse_algorithm("dflash") == Variant("dflash", {}, None)
    assert parse_algorithm("dflash-native") == Variant("dflash-native", {}, None)
    assert parse_algorithm("dflash[DFLASH_DEFER_CONTEXT=off; DFLASH_DRAFT_POLICY=off]") == Variant(
        "dflash", {"DFLASH_DEFER_CONTEXT": "off", "DFLASH_DRAFT_POLICY": "off"}, None)
    # Two drafters side by side in one run: each DFlash row may name its own.
    assert parse_algorithm("dflash[draft=/d/r10;DFLASH_DRAFT_POLICY=off]") == Variant(
        "dflash", {"DFLASH_DRAFT_POLICY": "off"}, "/d/r10")
    assert parse_algorithm("dflash-native[draft=/d/r10]") == Variant("dflash-native", {}, "/d/r10")
    # ... and its own block (tokens per verify pass, as --speculative-num-draft-tokens).
    assert parse_algorithm("dflash[draft_tokens=8;DFLASH_DRAFT_POLICY=off]") == Variant(
        "dflash", {"DFLASH_DRAFT_POLICY": "off"}, None, 8)
    assert parse_algorithm("dflash-native[draft_tokens=4]").draft_tokens == 4
    # Settings of the server process itself go on any row, the plugin's on its rows only.
    assert parse_algorithm("none[DFLASH_CPU_PRELOAD=off]") == Variant(
        "none", {"DFLASH_CPU_PRELOAD": "off"})
    assert parse_algorithm("dflash-native[DFLASH_CPU_PRELOAD=off]").env == {
        "DFLASH_CPU_PRELOAD": "off"}
    assert parse_algorithm("none[DFLASH_ARENA_CACHE=off]").env == {"DFLASH_ARENA_CACHE": "off"}
    for bad in ("none[DFLASH_DRAFT_POLICY=on]", "ngram[draft=/d]"):
        with pytest.raises(DFlashError, match="take settings other than DFLASH_ARENA_CACHE, "
                                              "DFLASH_CPU_CORES, DFLASH_CPU_PRELOAD"):
            parse_algorithm(bad)
    for bad in ("dflash[draft_tokens=1]", "dflash[draft_tokens=eight]", "dflash[draft_tokens=]"):
        with pytest.raises(DFlashError, match="draft_tokens"):
            parse_algorithm(bad)


def test_bench_rows_split_at_commas_outside_their_settings():
    from dflash_cli.commands.bench import split_algorithms
    assert split_algorithms("none, dflash[DFLASH_COST_MODEL=draft_fixed=0.2,draft_per_request=0.3]"
                            ",dflash-native") == [
        "none", "dflash[DFLASH_COST_MODEL=draft_fixed=0.2,draft_per_request=0.3]", "dflash-native"]
    assert split_algorithms("none,dflash") == ["none", "dflash"]


def test_bench_row_options_carry_the_rows_drafter_and_environment():
    from dflash_cli.commands.bench import Variant, _row_options
    from dflash_cli.serving.flags import ServeOptions
    base = ServeOptions(speculative_draft_model_path="/shipped", env={"FROM_YAML": "1"})
    other = _row_options(base, Variant("dflash", {"DFLASH_DEFER_CONTEXT": "on"}, "/d/r10"))
    assert other.speculative_algorithm == "DFLASH"
    assert other.speculative_draft_model_path == "/d/r10"
    assert other.env["FROM_YAML"] == "1" and other.env["DFLASH_DEFER_CONTEXT"] == "on"
    assert _row_options(base, Variant("dflash")).speculative_draft_model_path == "/shipped"
    assert _row_options(base, Variant("dflash", draft_tokens=8)).speculative_num_draft_tokens == 8
    assert _row_options(base, Variant("dflash")).speculative_num_draft_tokens is None
    native = _row_options(base, Variant("dflash-native"))
    assert "dflash" not in native.env["VLLM_PLUGINS"].split(",")
    plain = _row_options(base, Variant("none"))
    assert plain.speculative_algorithm == "NONE" and plain.speculative_draft_model_path is None
    assert base.env == {"FROM_YAML": "1"}  # the shared options are not changed


def test_bench_rows_name_the_drafter_they_measured():
    from dflash_cli.commands.bench import _row, _Sample
    from dflash_cli.serving.bench import SPEC_COUNTERS
    from dflash_cli.serving.flags import ServeOptions
    sample = _Sample(results=[], walls=[1.0], counted=dict.fromkeys(SPEC_COUNTERS, 0.0))
    row = _row("dflash[draft=/d/r10]", 1, [sample], ServeOptions(speculative_draft_model_path="/d/r10"))
    assert row["draft_model"] == "/d/r10"
    assert "draft_model" not in _row("none", 1, [sample], ServeOptions())


def test_bench_row_keeps_the_drafted_token_count_beside_the_block_setting():
    from dflash_cli.commands.bench import _row, _Sample
    from dflash_cli.serving.bench import SPEC_COUNTERS
    from dflash_cli.serving.flags import ServeOptions
    counted = {"vllm:spec_decode_num_drafts": 40.0, "vllm:spec_decode_num_draft_tokens": 110.0,
               "vllm:spec_decode_num_accepted_tokens": 60.0}
    assert set(counted) == set(SPEC_COUNTERS)
    row = _row("dflash", 1, [_Sample(results=[], walls=[1.0], counted=counted)],
               ServeOptions(speculative_draft_model_path="/d", speculative_num_draft_tokens=4))
    assert (row["num_drafts"], row["num_draft_tokens"], row["num_accepted_tokens"]) == (40, 110, 60)
    assert row["speculative_num_draft_tokens"] == 4
    assert row["accept_length"] == 2.5


def test_bench_row_with_its_own_drafter_is_checked_before_any_server(tmp_path, random_drafter,
                                                                     capsys):
    (tmp_path / "config.json").write_text("{}")  # a target folder; no server gets that far
    missing = tmp_path / "no-such-drafter"
    code, err = main_in_process(
        capsys, "bench", "--algorithms", f"none,dflash,dflash[draft={missing}]",
        "--model-path", str(tmp_path), "--speculative-draft-model-path", str(random_drafter),
        "--output", str(tmp_path / "b.json"))
    assert code == 2
    assert f"draft model {missing} is not a model folder" in err
    assert "starting server" not in err


@pytest.mark.parametrize("argv, message", [
    (["--algorithms", "none,eagle"], "unknown --algorithms entry 'eagle'"),
    (["--algorithms", "ngram[DFLASH_DEFER_CONTEXT=off]"], "only the DFlash rows"),
    (["--algorithms", "dflash[VLLM_PLUGINS=x]"], "is not DFLASH_NAME=value, draft=PATH or draft_tokens=N"),
    (["--algorithms", "dflash-native[DFLASH_DEFER_CONTEXT=off]"], "only the plugin's rows take"),
    (["--algorithms", "dflash[draft=]"], "draft= needs a drafter path"),
    (["--algorithms", "none,dflash[DFLASH_DEFER_CONTEXT=on"], "brackets do not pair up"),
    (["--algorithms", "none,dflash]"], "brackets do not pair up"),
    (["--algorithms", " , "], "--algorithms is empty"),
    (["--concurrency", "1,x"], "comma list of integers"),
    (["--concurrency", "0"], ">= 1"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_bench_bad_arguments(argv, message, capsys):
    code, err = main_in_process(capsys, "bench", *argv)
    assert code == 2
    assert message in err


def test_plugin_dflash_on_vllm_cpu_uses_the_draft_ids_executor(random_drafter, monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    opts = flags.resolve(options("--speculative-draft-model-path", str(random_drafter)))
    assert flags.uses_draft_ids_executor(opts, cpu=True)
    assert not flags.uses_draft_ids_executor(opts, cpu=False)  # one GPU: no process hop
    for algorithm in ("NONE", "NGRAM"):
        assert not flags.uses_draft_ids_executor(
            flags.resolve(options("--speculative-algorithm", algorithm)), cpu=True)
    # vLLM's native DFlash (the plugin excluded) stays vLLM's own path.
    assert not flags.uses_draft_ids_executor(opts, cpu=True, environ={"VLLM_PLUGINS": "other"})
    native = flags.resolve(options("--speculative-draft-model-path", str(random_drafter)))
    native.env["VLLM_PLUGINS"] = ""
    assert not flags.uses_draft_ids_executor(native, cpu=True, environ={})
    # An executor chosen in the engine arguments wins.
    chosen = flags.resolve(options("--speculative-draft-model-path", str(random_drafter),
                                   "--distributed-executor-backend=mp"))
    assert not flags.uses_draft_ids_executor(chosen, cpu=True)
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: True)
    argv = flags.vllm_launch(opts).argv
    assert argv[argv.index("--distributed-executor-backend") + 1] == flags.DRAFT_IDS_EXECUTOR
    assert flags.vllm_launch(chosen).argv.count("--distributed-executor-backend=mp") == 1
    assert "--distributed-executor-backend" not in flags.vllm_launch(chosen).argv


@pytest.mark.parametrize("native", [False, True])
def test_vllm_cpu_serves_in_float32_where_the_cpu_has_no_native_bf16(monkeypatch, capsys, native):
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: True)
    monkeypatch.setattr(flags, "default_cpu_dtype", lambda: None if native else "float32")
    argv = launch("--speculative-algorithm", "NONE").argv
    if native:
        assert "--dtype" not in argv  # vLLM keeps the model's dtype
    else:
        assert argv[argv.index("--dtype") + 1] == "float32"
        assert "no native bfloat16" in capsys.readouterr().err
    # A dtype the user chose, as a flag or as an engine argument, is kept.
    argv = launch("--speculative-algorithm", "NONE", "--dtype", "bfloat16").argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv.count("--dtype") == 1
    argv = launch("--speculative-algorithm", "NONE", "--", "--dtype", "float16").argv
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "float16"
    # Not on GPUs: vLLM's choice stands.
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: False)
    assert "--dtype" not in launch("--speculative-algorithm", "NONE").argv


def test_bench_rows_name_the_dtype_they_ran(monkeypatch):
    from dflash_cli.commands.bench import _row, _Sample
    from dflash_cli.serving.bench import SPEC_COUNTERS
    from dflash_cli.serving.flags import ServeOptions
    sample = _Sample(results=[], walls=[1.0], counted=dict.fromkeys(SPEC_COUNTERS, 0.0))
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: True)
    monkeypatch.setattr(flags, "default_cpu_dtype", lambda: "float32")
    assert _row("none", 1, [sample], ServeOptions())["dtype"] == "float32"  # this CPU's default
    assert _row("none", 1, [sample], ServeOptions(dtype="bfloat16"))["dtype"] == "bfloat16"
    for engine_args in (["--dtype", "float16"], ["--dtype=float16"]):
        assert _row("none", 1, [sample], ServeOptions(engine_args=engine_args))["dtype"] == "float16"
    monkeypatch.setattr(flags, "default_cpu_dtype", lambda: None)
    assert _row("none", 1, [sample], ServeOptions())["dtype"] == "auto"


def test_vllm_cpu_in_float32_drafts_a_shorter_block_by_default(random_drafter, monkeypatch):
    def draft_tokens(*argv):
        return spec_config(launch("--speculative-draft-model-path", str(random_drafter),
                                  *argv).argv)["num_speculative_tokens"]
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: True)
    monkeypatch.setattr(flags, "default_cpu_dtype", lambda: "float32")  # no native bf16
    assert draft_tokens() == flags.CPU_FP32_DRAFT_TOKENS - 1 == 3
    assert draft_tokens("--speculative-num-draft-tokens", "16") == 15  # the user's choice wins
    assert draft_tokens("--dtype", "bfloat16") == 15  # not float32: the checkpoint's block
    assert draft_tokens("--", "--dtype=bfloat16") == 15
    monkeypatch.setattr(flags, "default_cpu_dtype", lambda: None)  # native bf16 or unknown
    assert draft_tokens() == 15
    assert draft_tokens("--dtype", "float32") == 3  # float32 by choice: the same costs
    assert draft_tokens("--", "--dtype", "float") == 3
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: False)  # GPUs: the checkpoint's block
    assert draft_tokens("--dtype", "float32") == 15


def test_speculative_servers_report_acceptance_per_request(random_drafter):
    """vLLM's per-request acceptance metrics are on wherever speculation is (vLLM refuses the
    option without it); a value in the engine arguments wins."""
    flag = flags.PER_REQUEST_METRICS_FLAG
    for algorithm in ("DFLASH", "NGRAM"):
        argv = flags.vllm_launch(flags.resolve(options(
            "--speculative-algorithm", algorithm, "--speculative-draft-model-path",
            str(random_drafter)))).argv
        assert argv[argv.index(flag) + 1] == "summary"
    assert flag not in flags.vllm_launch(flags.resolve(options(
        "--speculative-algorithm", "NONE"))).argv
    chosen = flags.vllm_launch(flags.resolve(options(
        "--speculative-draft-model-path", str(random_drafter), f"{flag}=detailed"))).argv
    assert [a for a in chosen if a.startswith(flag)] == [f"{flag}=detailed"]


def test_the_embedded_target_drafts_from_its_training_answers_too(monkeypatch, capsys):
    from dflash_plugin.defaults import DEFAULT_DATASTORE_FILES, default_datastore_files

    files = default_datastore_files()
    assert [f.relative_to(f.parents[2]).as_posix() for f in files] == list(DEFAULT_DATASTORE_FILES)
    embedded = flags.ServeOptions(embedded_default=True, model_path="/m",
                                  speculative_draft_model_path="/d")
    monkeypatch.delenv("DFLASH_DATASTORE", raising=False)
    env = flags._default_env(embedded, cpu=False)
    assert env["DFLASH_DATASTORE"].split(",") == [str(f) for f in files]
    assert "training answers" in capsys.readouterr().err
    # the caller's value (empty: off) wins, and only the embedded target's DFLASH gets it
    monkeypatch.setenv("DFLASH_DATASTORE", "")
    launch_env = flags.Launch([], env, {}, "h", 1, "m").environ()
    assert launch_env["DFLASH_DATASTORE"] == ""
    for other in (dict(embedded_default=False), dict(speculative_algorithm="NGRAM"),
                  dict(engine="sglang")):
        assert flags.default_datastore(flags.replace(embedded, **other)) is None
    assert default_datastore_files(Path("/nonexistent")) == []
