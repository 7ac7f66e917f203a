#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine with one GPU and no network: Qwen3-4B-Base's shape with
# random weights, the byte tokenizer, hf rollouts, the sandbox, a few GRPO steps per player with the torch backend
# and an exact-resume check; then the paper preset's trainer path (benchmarks/gpu_check_paper.py: DeepSpeed ZeRO-3,
# the optimizer offloaded to the host with DeepSpeed's CPU Adam, ref_mode precompute, an idle player's state parked,
# the save cadence, exact resume, peak memory against the capacity plan) on the shape cut to 2 layers with the full
# vocabulary; then the one-GPU preset's three LoRA adapter players on one shared frozen backbone of Qwen3-1.7B-Base's
# shape (benchmarks/gpu_check_lora.py: one backbone in memory, the backbone's log-probs before any update, only
# adapters moving, exact resume from an adapter checkpoint, peak memory against the plan's trainer passes). vLLM is
# reported as not run (its CUDA wheel alone is far over what such a machine can be sent).
#
# Such a machine (KINDS.md of the device tool: Python 3.12, torch 2.11.0, transformers 5.17.0, huggingface_hub
# 1.33.0, tokenizers 0.23.2, safetensors 0.8.0, accelerate 1.15.0, numpy, pyyaml, regex, ...) has no Hydra or
# DeepSpeed, cannot reach any network, and receives the working tree plus at most 64 MiB of extra files. Its
# transformers 5.17.0 lies in our window (pyproject.toml: the one vLLM 0.32 accepts), so the check runs on it. Two steps:
#
#   experiments/gpu_check.sh prepare      here, with the network: build .gpu_wheels/ (the packages such a
#                                          machine lacks, as wheels) and print its size against the 64 MiB
#   experiments/gpu_check.sh run [ARGS]    there: install .gpu_wheels/ into a temporary folder put first on
#                                          PYTHONPATH (nothing is fetched; a carried package wins over the
#                                          image's), print what is imported from where (PROBLEM: lines for a
#                                          shadowed package or an unmet requirement; GPU_CHECK_STRICT=1 stops
#                                          there), and run the check (timeout 480 s); ARGS go to the script
#                                          (`run --device cpu --shape tiny` rehearses it all on a CPU)
#
# Run time on one H200, estimated: installing the wheels 10-20 s; the torch players and their resume check about
# 2.5 min; the paper unit about 2-3 min, a minute of it JIT-building DeepSpeed's CPU Adam op there (it needs a C++
# compiler and Python's headers on that machine: without them its items say NOT RUN and why); the one-GPU LoRA unit
# about 1-1.5 min (not yet run on a GPU). About 6-7 minutes in all; --budget-s 420 skips a unit that would start
# later. `--backends torch,deepspeed_zero2,paper_zero3,one_gpu_lora` adds ZeRO-2 player runs (about 2 more minutes).
#
# What is carried: DeepSpeed's declared requirements except torch, numpy and packaging, which such a machine has
# (tests/benchmarks/test_gpu_check.py keeps the lists complete), plus Hydra's and pydantic's, and setuptools
# (torch.utils.cpp_extension imports it to build the op). transformers and what it needs (huggingface_hub,
# tokenizers, safetensors, regex, pyyaml, ...) are the image's; the test checks their bounds. The wheels with
# compiled code (pydantic-core, msgpack, psutil, and ninja's binary) are downloaded for CPython 3.11-3.13 on
# manylinux x86_64 (GPU_PY_VERSIONS to change), everything else is a pure-Python wheel; `run` installs the one
# matching its interpreter. DeepSpeed and antlr4 4.9.3 have no wheel on PyPI: `prepare` builds them here from their
# sdists (DeepSpeed without building any op: its ops are JIT-built where used).
# `make gpu-check` is `experiments/gpu_check.sh run $(ARGS)`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WHEELS="${GPU_WHEELS:-.gpu_wheels}"
LIMIT_MIB=64  # the working tree and everything sent with it
# Pure-Python packages (one py3-none-any wheel serves every interpreter) and compiled ones (one per version).
# ninja is a binary in a py3-none-manylinux wheel: listed with the compiled ones, so that it is downloaded for the
# GPU machine's platform, not built for this one's.
PURE="hydra-core omegaconf antlr4-python3-runtime deepspeed hjson py-cpuinfo einops pydantic annotated-types
      typing-inspection typing-extensions tqdm setuptools peft"
COMPILED="pydantic-core msgpack psutil ninja"

prepare() {
  local py="${PY:-.venv/bin/python}" v pkgs=() bin=()
  version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  # The versions this project is tested with (its .venv), so the remote gets the same code.
  for p in $PURE; do pkgs+=("$p==$(version "$p")"); done
  for p in $COMPILED; do bin+=("$p==$(version "$p")"); done
  # No build isolation: DeepSpeed's setup.py imports torch (this venv's CPU build; DS_BUILD_OPS=0: no ops).
  DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "${pkgs[@]}"
  for v in ${GPU_PY_VERSIONS:-3.11 3.12 3.13}; do
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" --implementation cp \
      --python-version "$v" --abi "cp${v/./}" --abi abi3 --abi none \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${bin[@]}"
  done
  ls -1 "$WHEELS"
  local wheels_kib tree_kib
  wheels_kib=$(du -sk "$WHEELS" | cut -f1)
  # One du over every file (xargs would split a long list into several totals); a tracked file deleted in the
  # working tree is not sent, and du's complaint about it must not end the script (pipefail).
  tree_kib=$( (git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2> /dev/null || true) | tail -1 | cut -f1)
  echo "wheelhouse $WHEELS: $((wheels_kib / 1024)) MiB ($wheels_kib KiB); working tree $((tree_kib / 1024)) MiB;" \
       "together $(((wheels_kib + tree_kib) / 1024)) MiB of the $LIMIT_MIB MiB such a machine takes"
  if ((wheels_kib + tree_kib > LIMIT_MIB * 1024)); then echo "over the limit" >&2; exit 1; fi
  echo "send it with the working tree (carry: $WHEELS), then run: experiments/gpu_check.sh run"
}

install_wheels() {  # $1: python, $2: target folder
  local py="$1" site="$2"
  rm -rf "$site" && mkdir -p "$site"
  if [ ! -d "$WHEELS" ]; then
    echo "no $WHEELS/: nothing installed (run 'experiments/gpu_check.sh prepare' where there is a network)" >&2
    return 0
  fi
  local names
  names=$(ls "$WHEELS" | grep '\.whl$' | sed 's/-.*//' | sort -u | tr '\n' ' ')
  if "$py" -m pip --version > /dev/null 2>&1; then
    # --target ignores what the image has installed; --no-compile: only what is imported gets byte-compiled
    # (compiling all of transformers took 11 of the 14 s of this install on 2 cores).
    "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --find-links "$WHEELS" \
      --target "$site" $names
  else  # no pip there: a wheel is a zip archive; unpack the best match of each package for this interpreter
    "$py" - "$WHEELS" "$site" << 'EOF'
import sys, zipfile, pathlib
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename
rank = {tag: i for i, tag in enumerate(sys_tags())}
best = {}
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    name, _, _, tags = parse_wheel_filename(wheel.name)
    r = min((rank[t] for t in tags if t in rank), default=None)
    if r is not None and (name not in best or r < best[name][0]):
        best[name] = (r, wheel)
site = pathlib.Path(sys.argv[2])
for _, wheel in best.values():
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = member.filename.split("/")
            if parts[0].endswith(".data"):  # a wheel's data folder: scripts to bin/, libraries to the site
                if len(parts) < 3 or parts[1] not in ("scripts", "purelib", "platlib"):
                    continue
                target = site.joinpath("bin" if parts[1] == "scripts" else "", *parts[2:])
            else:
                target = site.joinpath(*parts)
            if member.is_dir():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
            if parts[0].endswith(".data") and parts[1] == "scripts":
                target.chmod(0o755)  # ninja's binary
EOF
  fi
  echo "installed from $WHEELS into $site: $names"
}

report_imports() {  # $1: python, $2: the folder the wheels went to; PYTHONPATH already set
  # What is imported, its version and from where (the carried folder or the image), and whether a carried
  # distribution is shadowed or a carried one's requirement is unmet. GPU_CHECK_STRICT=1: exit 3 on a problem.
  "$1" - "$WHEELS" "$2" << 'EOF'
import importlib, importlib.metadata as md, os, pathlib, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

wheels, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
carried = {}
if wheels.is_dir():
    for wheel in wheels.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        carried[name] = str(version)
problems = []
first = next((pathlib.Path(p).resolve() for p in sys.path if p), None)
print(f"python {sys.version.split()[0]} ({sys.executable}); {len(carried)} carried distributions in {site}, "
      f"first on sys.path: {first == site}")
if first != site:
    problems.append(f"sys.path starts with {first}, not the carried folder {site}")
# 1. Each carried distribution: the first one found on sys.path must be the carried one.
for name, version in sorted(carried.items()):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        problems.append(f"{name} {version}: carried but not found on sys.path")
        continue
    where = pathlib.Path(dist.locate_file("")).resolve()
    if dist.version != version or where != site:
        problems.append(f"{name}: carried {version}, but {dist.version} from {where} is found first")
# 2. Their requirements (extras aside) against what is found first.
for name in sorted(carried):
    try:
        requires = md.requires(name) or []
    except md.PackageNotFoundError:
        continue
    for text in requires:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{name} requires {req}: not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{name} requires {req}: {have} is installed")
# 3. What the check imports: version and origin.
for module, dist in (("torch", "torch"), ("transformers", "transformers"), ("huggingface_hub", "huggingface-hub"),
                     ("tokenizers", "tokenizers"), ("safetensors", "safetensors"), ("accelerate", "accelerate"),
                     ("deepspeed", "deepspeed"), ("hydra", "hydra-core"),
                     ("omegaconf", "omegaconf"), ("pydantic", "pydantic")):
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - report it; the check says what it cannot run
        problems.append(f"import {module} failed: {type(exc).__name__}: {exc}")
        print(f"{module:<16} import FAILED: {type(exc).__name__}: {exc}")
        continue
    path = pathlib.Path(mod.__file__).resolve()
    origin = "carried" if site in path.parents else "image"
    version = getattr(mod, "__version__", None) or md.version(dist)
    extra = f", cuda {mod.version.cuda}, GPU {mod.cuda.is_available()}" if module == "torch" else ""
    print(f"{module:<16} {version:<14} {origin:<8} {path.parent}{extra}")
    if canonicalize_name(dist) in carried and origin != "carried":
        problems.append(f"{module} is imported from {path.parent}, not from the carried {site}")
for line in problems:
    print(f"PROBLEM: {line}")
print(f"imports: {len(problems)} problem(s)")
sys.exit(3 if problems and os.environ.get("GPU_CHECK_STRICT") == "1" else 0)
EOF
}

run() {
  local py="${PYTHON:-python3}" site="${GPU_SITE:-${TMPDIR:-/tmp}/unifiedplayers-gpu-site}"
  local out="${OUT:-runs/gpu_check}"
  mkdir -p "$out"
  install_wheels "$py" "$site"
  # The carried folder first: it wins over the image's site-packages (an older transformers there included).
  export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"  # ninja's binary in bin/
  # cuBLAS's deterministic workspace (the exact-resume check); must be set before CUDA starts.
  export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
  report_imports "$py" "$site" 2>&1 | tee "$out/gpu_check.log"
  # DeepSpeed's CPU Adam op is JIT-built there, under TORCH_EXTENSIONS_DIR (default ~/.cache/unifiedplayers/...).
  # benchmarks/ is a package: run as a module from the repository's root (the cd above), src/ on PYTHONPATH.
  timeout 480 "$py" -m benchmarks.gpu_check --device cuda --shape qwen3_4b --steps 2 \
    --backends torch,paper_zero3,one_gpu_lora --budget-s 420 --out "$out" "$@" 2>&1 | tee -a "$out/gpu_check.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) sed -n '2,/^# `make gpu-check`/p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
