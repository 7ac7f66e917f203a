#!/usr/bin/env bash
# The 8-GPU node used as eight independent one-GPU runs: Table 3's 2 x 2 factorial (Planning, Evaluation
# trained or frozen) x 2 paired seeds on Qwen3-4B-Base, one run per GPU, in the background. Each resumes
# when this script is run again. (One run over all eight GPUs as data-parallel ranks: qwen3_4b.sh.)
#   MODEL_PATH=/models/Qwen3-4B-Base experiments/dp8_single_gpu_runs.sh
source "$(dirname "$0")/_common.sh"
need_model_path Qwen/Qwen3-4B-Base
EXPERIMENT="${EXPERIMENT:-paper_qwen3_4b}"
mkdir -p runs/qwen3_4b
i=0
for cfg in "" "schedule.train_evaluation=false" "schedule.train_planning=false" \
           "schedule.train_planning=false schedule.train_evaluation=false"; do
  for seed in 0 1; do
    # shellcheck disable=SC2086  # $cfg holds zero, one or two overrides
    CUDA_VISIBLE_DEVICES=$i nohup "$PY" -m unifiedplayers.train experiment="$EXPERIMENT" model.path="$MODEL_PATH" \
      seed=$seed $cfg run_dir="runs/qwen3_4b/table3-$i" resume=true > "runs/qwen3_4b-$i.log" 2>&1 &
    echo "GPU $i: seed $seed ${cfg:-full} -> runs/qwen3_4b/table3-$i (pid $!, log runs/qwen3_4b-$i.log)"
    i=$((i + 1))
  done
done
echo "then: make reproduce-table3 SCALE=paper (evaluates and aggregates finished members)"
