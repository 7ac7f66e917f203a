# Shared by the launch scripts of experiments/ (sourced, not run). Runs from the repository root with the
# project's environment; the backbone must be on disk (offline nodes): MODEL_PATH=DIR. A run over several nodes: the
# same script on each, with NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT (launch_ranks; experiments/README.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
command -v "$PY" > /dev/null || PY=python
export WANDB_MODE="${WANDB_MODE:-offline}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

need_model_path() {  # $1: the hub id, for the message
  if [ -z "${MODEL_PATH:-}" ] || [ ! -d "$MODEL_PATH" ]; then
    echo "set MODEL_PATH to a local copy of $1 (hf download $1 --local-dir DIR)" >&2
    exit 2
  fi
}

# torchrun over $1 ranks on this node, then its module and arguments. One node (NNODES unset or 1): --standalone, a
# rendezvous port of its own. Several: the same command on each node, with NNODES, NODE_RANK (0 on the node at
# MASTER_ADDR) and MASTER_ADDR, MASTER_PORT (29500), from which src/unifiedplayers/launch.py writes the options.
launch_ranks() {
  local nproc="$1" options
  shift
  options="$("$PY" -m unifiedplayers.launch "$nproc")"
  local -a torchrun_options
  mapfile -t torchrun_options <<< "$options"
  "$PY" -m torch.distributed.run "${torchrun_options[@]}" "$@"
}

paper_run() {  # $1: the conf/experiment preset, $2: the backbone's hub id, $3: runs/<name>; then overrides
  local experiment="$1" hub_id="$2" name="$3"
  shift 3
  need_model_path "$hub_id"
  NGPU="${NGPU:-8}" SEED="${SEED:-0}"
  RUN_DIR="${RUN_DIR:-runs/$name/seed$SEED}"
  mkdir -p "$RUN_DIR"
  local log="$RUN_DIR/launch.log"  # node 0's; each other node of a run over several has its own
  if [ "${NNODES:-1}" -gt 1 ] && [ "${NODE_RANK:-0}" != 0 ]; then log="$RUN_DIR/launch.node$NODE_RANK.log"; fi
  launch_ranks "$NGPU" -m unifiedplayers.train experiment="$experiment" model.path="$MODEL_PATH" seed="$SEED" \
    run_dir="$RUN_DIR" resume=true "$@" 2>&1 | tee -a "$log"
}
