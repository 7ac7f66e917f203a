#!/usr/bin/env bash
# Figure 1a: train, then probe the backbone and each outer iteration's checkpoints (eval/probes), and
# write figure1.json and figure1.png. SCALE=smoke (default): SmolLM2-135M on CPU, about an hour on 2 cores;
# SCALE=paper: the Qwen3-4B-Base preset on a GPU (MODEL_PATH=DIR). SEEDS paired seeds (default 3).
#   experiments/figure1.sh                       # smoke, three seeds
#   SCALE=paper SEEDS=1 MODEL_PATH=/models/Qwen3-4B-Base experiments/figure1.sh
source "$(dirname "$0")/_common.sh"
SCALE="${SCALE:-smoke}" SEEDS="${SEEDS:-3}" JOBS="${JOBS:-2}"
extra=()
if [ "$SCALE" = paper ]; then
  need_model_path Qwen/Qwen3-4B-Base
  extra+=("model.path=$MODEL_PATH")
  JOBS="${JOBS_PAPER:-1}"  # one GPU process at a time
fi
"$PY" -m eval.probes.figure1 --scale "$SCALE" --seeds "$SEEDS" --jobs "$JOBS" --root "runs/figure1/$SCALE" \
  "${extra[@]}" "$@"
