#!/usr/bin/env bash
# The paper's run on MiMo-7B-Base (conf/experiment/paper_mimo_7b.yaml) over the GPUs of one node as
# data-parallel ranks (NGPU, default 8). Resumes when run again (resume=true). Over several nodes: NNODES, NODE_RANK,
# MASTER_ADDR and MASTER_PORT on each, as for experiments/qwen3_4b.sh.
#   MODEL_PATH=/models/MiMo-7B-Base SEED=0 experiments/mimo_7b.sh [extra overrides]
source "$(dirname "$0")/_common.sh"
paper_run paper_mimo_7b XiaomiMiMo/MiMo-7B-Base mimo_7b "$@"
