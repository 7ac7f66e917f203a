#!/usr/bin/env bash
# The paper's main run on Qwen3-4B-Base (conf/experiment/paper_qwen3_4b.yaml) over the GPUs of one node as
# data-parallel ranks (NGPU, default 8; NGPU=1: one GPU). Resumes when run again (resume=true).
#   MODEL_PATH=/models/Qwen3-4B-Base SEED=0 experiments/qwen3_4b.sh [extra overrides]
source "$(dirname "$0")/_common.sh"
paper_run paper_qwen3_4b Qwen/Qwen3-4B-Base qwen3_4b "$@"
