#!/usr/bin/env bash
# The paper's run on MiMo-7B-Base (conf/experiment/paper_mimo_7b.yaml) over the GPUs of one node as
# data-parallel ranks (NGPU, default 8). Resumes when run again (resume=true).
#   MODEL_PATH=/models/MiMo-7B-Base SEED=0 experiments/mimo_7b.sh [extra overrides]
source "$(dirname "$0")/_common.sh"
need_model_path XiaomiMiMo/MiMo-7B-Base
NGPU="${NGPU:-8}" SEED="${SEED:-0}"
RUN_DIR="${RUN_DIR:-runs/mimo_7b/seed$SEED}"
mkdir -p "$RUN_DIR"
"${PY%python}torchrun" --nproc_per_node="$NGPU" -m unifiedplayers.train experiment=paper_mimo_7b \
  model.path="$MODEL_PATH" seed="$SEED" run_dir="$RUN_DIR" resume=true "$@" 2>&1 | tee -a "$RUN_DIR/launch.log"
