# Shared by the launch scripts of experiments/ (sourced, not run). Runs from the repository root with the
# project's environment; the backbone must be on disk (offline nodes): MODEL_PATH=DIR.
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

paper_run() {  # $1: the conf/experiment preset, $2: the backbone's hub id, $3: runs/<name>; then overrides
  local experiment="$1" hub_id="$2" name="$3"
  shift 3
  need_model_path "$hub_id"
  NGPU="${NGPU:-8}" SEED="${SEED:-0}"
  RUN_DIR="${RUN_DIR:-runs/$name/seed$SEED}"
  mkdir -p "$RUN_DIR"
  "${PY%python}torchrun" --nproc_per_node="$NGPU" -m unifiedplayers.train experiment="$experiment" \
    model.path="$MODEL_PATH" seed="$SEED" run_dir="$RUN_DIR" resume=true "$@" 2>&1 | tee -a "$RUN_DIR/launch.log"
}
