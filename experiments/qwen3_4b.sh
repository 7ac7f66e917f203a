#!/usr/bin/env bash
# The paper's main run on Qwen3-4B-Base (conf/experiment/paper_qwen3_4b.yaml) over the GPUs of one node as
# data-parallel ranks (NGPU, default 8; NGPU=1: one GPU). Resumes when run again (resume=true).
#   MODEL_PATH=/models/Qwen3-4B-Base SEED=0 experiments/qwen3_4b.sh [extra overrides]
source "$(dirname "$0")/_common.sh"
need_model_path Qwen/Qwen3-4B-Base
NGPU="${NGPU:-8}" SEED="${SEED:-0}"
RUN_DIR="${RUN_DIR:-runs/qwen3_4b/seed$SEED}"
mkdir -p "$RUN_DIR"
"${PY%python}torchrun" --nproc_per_node="$NGPU" -m unifiedplayers.train experiment=paper_qwen3_4b \
  model.path="$MODEL_PATH" seed="$SEED" run_dir="$RUN_DIR" resume=true "$@" 2>&1 | tee -a "$RUN_DIR/launch.log"
