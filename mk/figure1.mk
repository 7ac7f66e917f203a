# `make reproduce-figure1 [SCALE=smoke|paper] [SEEDS=1] [JOBS=2] [FIGURE1_ROOT=runs/figure1] [MODEL_PATH=DIR] [ARGS=...]`
# The paper's Figure 1a from held-out probes (eval/probes/figure1.py): trains one run per paired seed
# (SCALE=smoke: conf/experiment/figure1_smoke.yaml, SmolLM2-135M on CPU; SCALE=paper: paper_qwen3_4b on GPUs),
# probes the backbone (iteration 0) and each iteration's end checkpoints, and writes figure1.json and
# figure1.png into $(FIGURE1_ROOT)/$(SCALE); its path is the last line printed. Rerunning continues where it
# stopped. ARGS: training overrides (key=value). PROBE_ARGS: options of `python -m eval.probes` (sizes).
# MODEL_PATH: the backbone on disk for SCALE=paper (`hf download Qwen/Qwen3-4B-Base --local-dir DIR`), passed as
# the override model.path=DIR (as experiments/figure1.sh does). The training runs take it; each probe job reads
# its run's config.yaml (--run), which training writes with it. Ignored, and said so, at SCALE=smoke (the
# embedded SmolLM2-135M; ARGS=model.path=... overrides it there).
# `make reproduce-figure1-ablation [SCALE=smoke|paper] [SEEDS=1] [JOBS=2] [FIGURE1_ABLATION_ROOT=runs/figure1_ablation]`
# (eval/probes/figure1_ablation.py): the same preset trained twice per seed, `full` and `no_perturbation`
# (Table 5's "w/o Perturbation Engine": perturbation=none), both probed on the same held-out probes; writes
# figure1_ablation.json and figure1_ablation.png into $(FIGURE1_ABLATION_ROOT)/$(SCALE) (runs in <arm>/seed<s>)
# and prints the json's path last. Rerunning skips finished runs and probes and resumes partial ones.
# MODEL_PATH, ARGS and PROBE_ARGS as above (ARGS apply to both arms).
# COLLECT_ONLY=1 (either target): write the json and png from the runs and probes done so far, start nothing
# (a run spanning sessions: its figures now; what is missing is null). Probes start with the endpoints: the
# backbone and the last iteration, then the middle iterations.
# JOBS: processes at a time at SCALE=smoke; at the paper scale always 1 (its jobs would share one GPU), as
# experiments/figure1.sh runs it.
# Included by the main Makefile, which defines PY and `setup`; SCALE and JOBS default as in mk/reproduce.mk.
SCALE ?= smoke
SEEDS ?= 1
JOBS ?= 2
FIGURE1_JOBS = $(if $(filter smoke,$(SCALE)),$(JOBS),1)
FIGURE1_ROOT ?= runs/figure1
FIGURE1_ABLATION_ROOT ?= runs/figure1_ablation
PROBE_ARGS ?=
COLLECT_ONLY ?=
MODEL_PATH ?=
FIGURE1_MODEL = $(if $(and $(strip $(MODEL_PATH)),$(filter-out smoke,$(SCALE))),'model.path=$(strip $(MODEL_PATH))')

.PHONY: reproduce-figure1 reproduce-figure1-ablation probes-data

reproduce-figure1: setup
	$(if $(and $(strip $(MODEL_PATH)),$(filter smoke,$(SCALE))),@echo "reproduce-figure1: MODEL_PATH is ignored at SCALE=smoke (the embedded model): use SCALE=paper or ARGS=model.path=..." >&2)
	$(PY) -m eval.probes.figure1 --scale $(SCALE) --seeds $(SEEDS) --jobs $(FIGURE1_JOBS) \
	  --root $(FIGURE1_ROOT)/$(SCALE) $(if $(PROBE_ARGS),--probe-args="$(PROBE_ARGS)") $(if $(COLLECT_ONLY),--collect-only) $(FIGURE1_MODEL) $(ARGS)

reproduce-figure1-ablation: setup
	$(if $(and $(strip $(MODEL_PATH)),$(filter smoke,$(SCALE))),@echo "reproduce-figure1-ablation: MODEL_PATH is ignored at SCALE=smoke (the embedded model): use SCALE=paper or ARGS=model.path=..." >&2)
	$(PY) -m eval.probes.figure1_ablation --scale $(SCALE) --seeds $(SEEDS) --jobs $(FIGURE1_JOBS) \
	  --root $(FIGURE1_ABLATION_ROOT)/$(SCALE) $(if $(PROBE_ARGS),--probe-args="$(PROBE_ARGS)") $(if $(COLLECT_ONLY),--collect-only) $(FIGURE1_MODEL) $(ARGS)

# Remake the fixed probe sets of eval/probes/data/ (the same bytes unless the offline subsets change).
probes-data: setup
	$(PY) -m eval.probes.make_sets
