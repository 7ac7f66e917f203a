#!/usr/bin/env bash
# The paper's main run on Qwen3-4B-Base (conf/experiment/paper_qwen3_4b.yaml) over the GPUs of one node as
# data-parallel ranks (NGPU, default 8; NGPU=1: one GPU). Resumes when run again (resume=true).
#   MODEL_PATH=/models/Qwen3-4B-Base SEED=0 experiments/qwen3_4b.sh [extra overrides]
# Over NNODES nodes of NGPU ranks each: the same command on every node, with NODE_RANK (0 on the node at MASTER_ADDR),
# MASTER_ADDR and MASTER_PORT (29500), the run directory on a filesystem every node shares (docs/distributed.md):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MODEL_PATH=/models/Qwen3-4B-Base experiments/qwen3_4b.sh   # on node0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 MODEL_PATH=/models/Qwen3-4B-Base experiments/qwen3_4b.sh   # on node1
source "$(dirname "$0")/_common.sh"
paper_run paper_qwen3_4b Qwen/Qwen3-4B-Base qwen3_4b "$@"
