#!/usr/bin/env bash
# The 8-GPU node used as eight independent one-GPU runs: Table 3's 2 x 2 factorial (Planning, Evaluation
# trained or frozen) x paired seeds 0 and 1 on Qwen3-4B-Base, one run per GPU, in the background. They are
# members of `make reproduce-table3 SCALE=paper`: the same overrides, in the directories where it looks
# (ABLATION_ROOT/<experiment>/table3/<overrides>, from `python -m ablations.sweeps --list-members`), so the
# target evaluates them instead of training them again, and trains only the rest (seed 2, the stale control).
# (One run over all eight GPUs as data-parallel ranks: qwen3_4b.sh.)
#   MODEL_PATH=/models/Qwen3-4B-Base experiments/dp8_single_gpu_runs.sh
# Each run parks its idle players' state in its own trainer.offload_dir, <its run directory>/offload. Each run checks
# at its start only what is free then, so all eight would pass where their sum does not fit: before starting any,
# this script checks the sum of their host RAM and disk against the node's (python -m unifiedplayers.capacity
# --members - --here, which prints the plan of each and their running sums), starts the first that fit together and
# says which. Run it again when those have finished: it skips the finished members, resumes a partial one and starts
# the rest that then fit. While a member it started is still running it starts nothing. CAPACITY_CHECK=false starts
# them all unchecked (each still checks itself at its start); CAPACITY_MACHINE='--host-ram-gb 512 --disk-tb 8' checks
# the sum against the machine those options of python -m unifiedplayers.capacity describe instead of this node.
source "$(dirname "$0")/_common.sh"
need_model_path Qwen/Qwen3-4B-Base
SCALE="${SCALE:-paper}" ABLATION_ROOT="${ABLATION_ROOT:-runs/ablations}" CAPACITY_CHECK="${CAPACITY_CHECK:-true}"
CAPACITY_MACHINE="${CAPACITY_MACHINE:---here}"
members="$("$PY" -m ablations.sweeps table3 --scale "$SCALE" --seeds 0,1 --nproc-per-node 1 --root "$ABLATION_ROOT" \
  --list-members model.path="$MODEL_PATH" | { grep -v 'schedule.feedback=stale' || true; })"

running() {  # $1: a member's run directory; true while the run this script started there is alive
  local pid command
  pid="$(cat "$1/launch.pid" 2> /dev/null)" || return 1
  command="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null)" || return 1
  [[ "$command" == *unifiedplayers.train*"$1"* ]]
}

planned="" busy=0 total=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  eval "set -- $line"  # the member's run directory, then its overrides, run_dir among them (shell words)
  total=$((total + 1))
  if running "$1"; then
    echo "still running: $1 (pid $(cat "$1/launch.pid"))"
    busy=$((busy + 1))
    continue
  fi
  # Its own offload directory; Hydra quotes the value (a member's directory holds '=' and ',')
  planned+="$line $(printf '%q' "trainer.offload_dir='$1/offload'")"$'\n'
done <<< "$members"
if [ "$total" = 0 ]; then
  echo "every member of these one-GPU runs under $ABLATION_ROOT has finished: make reproduce-table3 SCALE=$SCALE" \
    "MODEL_PATH=$MODEL_PATH ABLATION_ROOT=$ABLATION_ROOT evaluates them"
  exit 0
elif [ "$busy" -gt 0 ]; then
  echo "$busy of the members started here are still running: nothing more is started beside them (their memory and" \
    "disk peaks are still ahead); run this script again when they have finished, to start the other" \
    "$((total - busy))"
  exit 0
fi
fitting="$planned" rc=0
if [ "$CAPACITY_CHECK" != false ]; then  # standard output: the lines of the members that fit together
  fitting="$(printf '%s' "$planned" | "$PY" -m unifiedplayers.capacity --members - $CAPACITY_MACHINE --gpus 1)" || rc=$?
  if [ "$rc" = 2 ]; then
    echo "not started: the members' capacity plan failed (above)" >&2
    exit 2
  elif [ -z "$fitting" ]; then
    echo "not started: this node has not the host RAM or disk for even one of these runs (the table above;" \
      "CAPACITY_CHECK=false starts them anyway)" >&2
    exit 1
  fi
fi
i=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  eval "set -- $line"
  run_dir="$1"
  shift
  mkdir -p "$run_dir"
  CUDA_VISIBLE_DEVICES=$i nohup "$PY" -m unifiedplayers.train "$@" >> "$run_dir/launch.log" 2>&1 &
  echo "$!" > "$run_dir/launch.pid"
  echo "GPU $i: $* -> $run_dir (pid $!, log $run_dir/launch.log)"
  i=$((i + 1))
done <<< "$fitting"
if [ "$i" -lt "$total" ]; then
  echo "started $i of the $total members: the other $((total - i)) do not fit beside them (the table above)." \
    "Run this script again when these have finished: it starts the rest that then fit."
fi
echo "when they finish: make reproduce-table3 SCALE=$SCALE MODEL_PATH=$MODEL_PATH ABLATION_ROOT=$ABLATION_ROOT" \
  "(trains the other members over all GPUs, evaluates and aggregates)"
