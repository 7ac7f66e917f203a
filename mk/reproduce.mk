# `make reproduce-table3|5|15|16|17|1 [SCALE=smoke|paper|paper_mimo_7b] [LAUNCHER=local|slurm] [JOBS=2] [NGPU=8]
#  [MODEL_PATH=DIR] [ARGS=...]`
# Each target trains the sweep's members (unifiedplayers.train, resume=true), evaluates the finished members
# with eval/ and prints the paper's table (markdown + LaTeX) beside the paper's numbers.
# Rerunning an interrupted target skips finished members and resumes partial ones (ablations/sweeps.py).
# SCALE=smoke: toy scale on CPU (conf/experiment/ablation_smoke.yaml, conf/eval/ablation_smoke.yaml): a Hydra
# multirun, JOBS members at a time (joblib), or one Slurm job per member (LAUNCHER=slurm).
# SCALE=paper: the paper presets on GPUs (conf/experiment/paper_qwen3_4b.yaml, conf/eval/paper.yaml; the paper's
# K, M, P and schedule, our assumptions for lr, clip, KL, S and mu): one
# member at a time over NGPU GPUs (torchrun --nproc_per_node=NGPU), or with LAUNCHER=slurm one whole-node job per
# member, torchrun inside (ablations/conf/slurm_node.yaml; ARGS="--slurm partition=gpu").
# SCALE=paper_mimo_7b: the same on MiMo-7B-Base (conf/experiment/paper_mimo_7b.yaml), Tables 1-2's lower half.
# MODEL_PATH: the backbone on disk at the paper scales (`hf download Qwen/Qwen3-4B-Base --local-dir DIR`), passed
# to every member as model.path=DIR (as experiments/ does); ignored, and said so, at SCALE=smoke.
# JOBS: training members at a time at SCALE=smoke; evaluation processes at a time at every scale.
# Table 1 with Socratic-Zero: ARGS="--teacher-endpoint URL --teacher-model NAME" (left out, and said so, without).
# Included by the main Makefile, which defines PY and `setup`.
SCALE ?= smoke
LAUNCHER ?= local
JOBS ?= 2
NGPU ?= 8
MODEL_PATH ?=
ABLATION_ROOT ?= runs/ablations
REPRODUCE_TABLES := 3 5 15 16 17 1
REPRODUCE_MODEL = $(if $(and $(strip $(MODEL_PATH)),$(filter paper%,$(SCALE))),'model.path=$(strip $(MODEL_PATH))')

.PHONY: $(addprefix reproduce-table,$(REPRODUCE_TABLES))

$(addprefix reproduce-table,$(REPRODUCE_TABLES)): reproduce-table%: setup
	$(if $(and $(strip $(MODEL_PATH)),$(filter-out paper%,$(SCALE))),@echo "reproduce-table$*: MODEL_PATH is ignored at SCALE=$(SCALE) (its preset's model): use SCALE=paper or ARGS=model.path=..." >&2)
	$(PY) -m ablations.sweeps table$* --scale $(SCALE) --launcher $(LAUNCHER) --jobs $(JOBS) --nproc-per-node $(NGPU) \
	  --root $(ABLATION_ROOT) $(REPRODUCE_MODEL) $(ARGS)
