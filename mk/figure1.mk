# `make reproduce-figure1 [SCALE=smoke|paper] [SEEDS=1] [JOBS=2] [FIGURE1_ROOT=runs/figure1] [ARGS=...]`
# The paper's Figure 1a from held-out probes (eval/probes/figure1.py): trains one run per paired seed
# (SCALE=smoke: conf/experiment/figure1_smoke.yaml, SmolLM2-135M on CPU; SCALE=paper: paper_qwen3_4b on GPUs),
# probes the backbone (iteration 0) and each iteration's end checkpoints, and writes figure1.json and
# figure1.png into $(FIGURE1_ROOT)/$(SCALE); its path is the last line printed. Rerunning continues where it
# stopped. ARGS: training overrides (key=value). PROBE_ARGS: options of `python -m eval.probes` (sizes).
# Included by the main Makefile, which defines PY and `setup`; SCALE and JOBS default as in mk/reproduce.mk.
SCALE ?= smoke
SEEDS ?= 1
JOBS ?= 2
FIGURE1_ROOT ?= runs/figure1
PROBE_ARGS ?=

.PHONY: reproduce-figure1 probes-data

reproduce-figure1: setup
	$(PY) -m eval.probes.figure1 --scale $(SCALE) --seeds $(SEEDS) --jobs $(JOBS) \
	  --root $(FIGURE1_ROOT)/$(SCALE) $(if $(PROBE_ARGS),--probe-args="$(PROBE_ARGS)") $(ARGS)

# Remake the fixed probe sets of eval/probes/data/ (the same bytes unless the offline subsets change).
probes-data: setup
	$(PY) -m eval.probes.make_sets
