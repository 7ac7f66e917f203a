#!/usr/bin/env bash
# Figure 1 with and without the perturbation engine (what `make reproduce-figure1-ablation` runs): the preset
# trained twice per seed, `full` and `no_perturbation` (Table 5's "w/o Perturbation Engine", perturbation=none),
# both probed on the same held-out probes; writes figure1_ablation.json and figure1_ablation.png.
# SCALE=smoke (default): SmolLM2-135M on CPU; SCALE=paper: the Qwen3-4B-Base preset on a GPU (MODEL_PATH=DIR).
# SEEDS paired seeds (default 1), each trained once per arm. Resumes when run again.
#   experiments/figure1_ablation.sh
#   SCALE=paper MODEL_PATH=/models/Qwen3-4B-Base experiments/figure1_ablation.sh
source "$(dirname "$0")/_common.sh"
SCALE="${SCALE:-smoke}" SEEDS="${SEEDS:-1}" JOBS="${JOBS:-2}"
extra=()
if [ "$SCALE" = paper ]; then
  need_model_path Qwen/Qwen3-4B-Base
  extra+=("model.path=$MODEL_PATH")
  JOBS="${JOBS_PAPER:-1}"  # one GPU process at a time
fi
"$PY" -m eval.probes.figure1_ablation --scale "$SCALE" --seeds "$SEEDS" --jobs "$JOBS" \
  --root "runs/figure1_ablation/$SCALE" "${extra[@]}" "$@"
