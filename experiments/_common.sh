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
