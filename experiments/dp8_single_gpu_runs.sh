#!/usr/bin/env bash
# The 8-GPU node used as eight independent one-GPU runs: Table 3's 2 x 2 factorial (Planning, Evaluation
# trained or frozen) x paired seeds 0 and 1 on Qwen3-4B-Base, one run per GPU, in the background. They are
# members of `make reproduce-table3 SCALE=paper`: the same overrides, in the directories where it looks
# (ABLATION_ROOT/<experiment>/table3/<overrides>, from `python -m ablations.sweeps --list-members`), so the
# target evaluates them instead of training them again, and trains only the rest (seed 2, the stale control).
# Each resumes when this script is run again. (One run over all eight GPUs as data-parallel ranks: qwen3_4b.sh.)
#   MODEL_PATH=/models/Qwen3-4B-Base experiments/dp8_single_gpu_runs.sh
source "$(dirname "$0")/_common.sh"
need_model_path Qwen/Qwen3-4B-Base
SCALE="${SCALE:-paper}" ABLATION_ROOT="${ABLATION_ROOT:-runs/ablations}"
members="$("$PY" -m ablations.sweeps table3 --scale "$SCALE" --seeds 0,1 --nproc-per-node 1 --root "$ABLATION_ROOT" \
  --list-members model.path="$MODEL_PATH" | { grep -v 'schedule.feedback=stale' || true; })"
i=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  eval "set -- $line"  # the member's run directory, then its overrides, run_dir among them (shell words)
  run_dir="$1"
  shift
  mkdir -p "$run_dir"
  CUDA_VISIBLE_DEVICES=$i nohup "$PY" -m unifiedplayers.train "$@" >> "$run_dir/launch.log" 2>&1 &
  echo "GPU $i: $* -> $run_dir (pid $!, log $run_dir/launch.log)"
  i=$((i + 1))
done <<< "$members"
echo "when they finish: make reproduce-table3 SCALE=$SCALE MODEL_PATH=$MODEL_PATH ABLATION_ROOT=$ABLATION_ROOT" \
  "(trains the other members over all GPUs, evaluates and aggregates)"
