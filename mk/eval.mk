# Evaluation harness (eval/). Included by the main Makefile, which defines PY and `setup`.
#   make eval CKPT=runs/X BENCH=math500,gsm8k [MODES=vanilla,tool] [EVAL=paper] [ARGS=...]
#     (a CKPT inside a training run takes the method label, mode and backbone from its config.yaml;
#      MODES= overrides the mode). Without EVAL, eval.run's default eval=paper, which it refuses on a machine
#      without a GPU (pass EVAL=smoke, or EVAL=paper to run the paper's protocol there anyway)
#   make eval-smoke        # embedded SmolLM2-135M on the offline subsets, both modes, < 10 min on 2 cores
#   make eval-data         # download and convert the hub datasets into data/eval/ (needs the network)
#   make eval-analysis RUN=runs/X   # all analyses of a training run directory
EVAL ?=
CKPT ?=
BENCH ?=
MODES ?=
RUN ?=
EVAL_OUT ?=
# Torch threads of the smoke run. One thread: on a 2-core machine shared with other work, two OpenMP
# threads per process spin against each other and a step takes several times longer.
SMOKE_THREADS ?= 1

.PHONY: eval eval-smoke eval-data eval-analysis

eval: setup
	$(PY) -m eval.run $(if $(EVAL),eval=$(EVAL)) \
	  $(if $(CKPT),ckpt=$(CKPT)) \
	  $(if $(BENCH),'eval.run=[$(BENCH)]') \
	  $(if $(MODES),'eval.modes=[$(MODES)]') \
	  $(if $(EVAL_OUT),out_dir=$(EVAL_OUT)) $(ARGS)

eval-smoke: setup
	OMP_NUM_THREADS=$(SMOKE_THREADS) $(PY) -m eval.run eval=smoke $(if $(EVAL_OUT),out_dir=$(EVAL_OUT)) $(ARGS)

eval-data: setup
	$(PY) eval/prepare_data.py --all --data-dir data/eval

eval-analysis: setup
	@test -n "$(RUN)" || (echo "usage: make eval-analysis RUN=runs/<run dir>"; exit 2)
	$(PY) -m eval.analysis.all $(RUN)
