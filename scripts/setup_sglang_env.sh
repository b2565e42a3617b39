#!/usr/bin/env bash
# Create the SGLang environment (.venv-sglang): SGLang pins CUDA torch 2.14.1 and its own
# transformers, so it cannot share the CPU vLLM environment (.venv). Used by tests/sglang/
# (`make test`) and by `dflash serve --engine sglang`.
#
#   scripts/setup_sglang_env.sh            # idempotent: a second run returns in well under 1 s
#   DFLASH_SGLANG_VENV=DIR ...             # somewhere else (e.g. a cache kept between CI runs)
#   DFLASH_SGLANG_FULL=1 ...               # all of SGLang's dependencies (serving on a GPU)
#
# Without a GPU (and without DFLASH_SGLANG_FULL=1) it installs `sglang --no-deps` plus only the
# packages its imports need: the CUDA kernels, FlashInfer and friends are left out (~6 GB and
# ~1.5 min instead of ~11 GB and ~4 min). Every SGLang module the adapter and its tests use
# imports; a server cannot start (SGLang refuses DFLASH on CPU anyway). With a GPU (nvidia-smi
# works) the full dependency set is installed.
#
# A stamp file in the environment records a hash of this script, pyproject.toml, the repository
# path and the mode; when it matches and the interpreter is there, nothing is done.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DFLASH_SGLANG_VENV:-$ROOT/.venv-sglang}
PYTHON=${DFLASH_SGLANG_BASE_PYTHON:-python3.11}
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
# The packages SGLang's modules import at load time (found by importing the DFLASH worker, the
# model registry, server_args and launch_server), pinned where SGLang pins them.
IMPORT_DEPS=(aiohttp apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 dill distro einops fastapi
             gguf ipython loguru msgspec openai==2.8.0 orjson partial_json_parser pillow psutil
             pybase64 pyzmq requests sentencepiece==0.2.1 setproctitle torchvision "uvicorn>=0.51")
# The shared core's needs, at SGLang's pins where it has them.
CORE_DEPS=(transformers==5.19.0 tokenizers==0.23.2 safetensors numpy tqdm pyyaml pytest)

if [[ -n "${DFLASH_SGLANG_FULL:-}" ]] || nvidia-smi -L >/dev/null 2>&1; then
    MODE=full
else
    MODE=minimal
fi
STAMP=$VENV/.dflash-setup-stamp
KEY=$( { cat "${BASH_SOURCE[0]}" "$ROOT/pyproject.toml"; echo "$ROOT $MODE"; } | sha256sum | cut -c1-16)

if [[ -x $VENV/bin/python && -f $STAMP && $(cat "$STAMP") == "$KEY" ]]; then
    echo "[setup_sglang_env] $VENV is up to date (sglang $SGLANG_VERSION, $MODE)"
    exit 0
fi

began=$SECONDS
step() {  # step NAME: print the time the previous step took, then NAME
    echo "[setup_sglang_env] +$((SECONDS - began))s $*"
}
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)
pip_install() {
    # Without SGLang's dependencies pip lists every one of them as a "conflict" after each
    # install; that list (and notes about this machine's local package folders) is noise here.
    { "${PIP[@]}" "$@" 2>&1; } | { grep -v -E "^(ERROR: pip's dependency resolver|sglang [0-9.]+ requires|WARNING: Location )" || true; }
}

# ~6 GB once installed (~11 GB in full mode); pip keeps no copy of the wheels it downloads.
if [[ $MODE == full ]]; then NEED_GB=13; else NEED_GB=7; fi
"$ROOT/scripts/check_free_disk.sh" "$VENV:$NEED_GB"
export PIP_NO_CACHE_DIR=${PIP_NO_CACHE_DIR:-1}

if [[ ! -x $VENV/bin/python ]]; then
    step "creating $VENV with $PYTHON"
    if ! command -v "$PYTHON" >/dev/null; then
        echo "[setup_sglang_env] $PYTHON not found: SGLang $SGLANG_VERSION needs Python 3.11+" >&2
        exit 1
    fi
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"

if [[ $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null) != "$TORCH_VERSION"* ]]; then
    step "installing torch==$TORCH_VERSION (CUDA build; runs on CPU too)"
    pip_install "torch==$TORCH_VERSION"
fi

# One resolution per step, with every pin in it, so nothing is installed twice.
if [[ $MODE == full ]]; then
    step "installing sglang==$SGLANG_VERSION with all its dependencies"
    pip_install "sglang==$SGLANG_VERSION" "torch==$TORCH_VERSION" "${CORE_DEPS[@]}"
else
    step "installing sglang==$SGLANG_VERSION without dependencies"
    pip_install --no-deps "sglang==$SGLANG_VERSION"
    step "installing what SGLang's imports need and the core's dependencies"
    pip_install "torch==$TORCH_VERSION" "${IMPORT_DEPS[@]}" "${CORE_DEPS[@]}"
fi

step "installing dflash-plugin (editable, from $ROOT)"
pip_install --no-deps -e "$ROOT"

step "checking that the adapter's SGLang modules import"
CHECK_LOG=$VENV/.dflash-setup-check.log
if ! SGLANG_PLUGINS=dflash "$VENV/bin/python" - >"$CHECK_LOG" 2>&1 <<'EOF'
import importlib
import importlib.metadata as md

for module in ("sglang.srt.plugins", "sglang.srt.server_args", "sglang.srt.speculative.spec_info",
               "sglang.srt.speculative.dflash_worker_v2", "sglang_ext.draft_model",
               "sglang_ext.plugin"):
    importlib.import_module(module)
names = [ep.value for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "dflash"]
assert names == ["sglang_ext.plugin:register"], names
EOF
then
    cat "$CHECK_LOG" >&2
    echo "[setup_sglang_env] the SGLang environment is incomplete (log above)" >&2
    exit 1
fi

echo "$KEY" > "$STAMP"
step "done: $VENV ($(du -sh "$VENV" | cut -f1), sglang $SGLANG_VERSION, $MODE)"
