# `make reproduce-table3|5|15|16|17|1 [SCALE=smoke|paper|paper_mimo_7b] [LAUNCHER=local|slurm] [JOBS=2] [ARGS=...]`
# Each target trains the sweep's members (Hydra multirun of unifiedplayers.train, resume=true), evaluates
# the finished members with eval/ and prints the paper's table (markdown + LaTeX) beside the paper's numbers.
# Rerunning an interrupted target skips finished members and resumes partial ones (ablations/sweeps.py).
# SCALE=smoke: toy scale on CPU (conf/experiment/ablation_smoke.yaml, conf/eval/ablation_smoke.yaml).
# SCALE=paper: the paper's settings on GPUs (conf/experiment/paper_qwen3_4b.yaml, conf/eval/paper.yaml).
# SCALE=paper_mimo_7b: the same on MiMo-7B-Base (conf/experiment/paper_mimo_7b.yaml), Tables 1-2's lower half.
# Table 1 with Socratic-Zero: ARGS="--teacher-endpoint URL --teacher-model NAME" (left out, and said so, without).
# Included by the main Makefile, which defines PY and `setup`.
SCALE ?= smoke
LAUNCHER ?= local
JOBS ?= 2
ABLATION_ROOT ?= runs/ablations
REPRODUCE_TABLES := 3 5 15 16 17 1

.PHONY: $(addprefix reproduce-table,$(REPRODUCE_TABLES))

$(addprefix reproduce-table,$(REPRODUCE_TABLES)): reproduce-table%: setup
	$(PY) -m ablations.sweeps table$* --scale $(SCALE) --launcher $(LAUNCHER) --jobs $(JOBS) --root $(ABLATION_ROOT) $(ARGS)
