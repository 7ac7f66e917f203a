"""experiments/: the launch scripts parse, refuse to start without the backbone on disk, and call the
project's entry points with the paper presets (PY=echo prints the command instead of running it)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["qwen3_4b.sh", "mimo_7b.sh", "dp8_single_gpu_runs.sh", "figure1.sh"]


def _run(script, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    e.update(env)
    return subprocess.run(["bash", str(ROOT / "experiments" / script)], capture_output=True, text=True, env=e,
                          timeout=60)


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / "experiments" / script)]).returncode == 0
    assert os.access(ROOT / "experiments" / script, os.X_OK)


@pytest.mark.parametrize("script", ["qwen3_4b.sh", "mimo_7b.sh", "dp8_single_gpu_runs.sh"])
def test_gpu_scripts_need_the_backbone_on_disk(script, tmp_path):
    r = _run(script, tmp_path, MODEL_PATH=str(tmp_path / "missing"))
    assert r.returncode == 2 and "set MODEL_PATH" in r.stderr


def test_the_commands(tmp_path):
    (tmp_path / "model").mkdir()
    r = _run("figure1.sh", tmp_path, PY="echo")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["-m", "eval.probes.figure1", "--scale", "smoke", "--seeds", "3", "--jobs", "2",
                                "--root", "runs/figure1/smoke"]
    r = _run("figure1.sh", tmp_path, PY="echo", SCALE="paper", SEEDS="1", MODEL_PATH=str(tmp_path / "model"))
    assert "--scale paper --seeds 1 --jobs 1" in r.stdout and f"model.path={tmp_path / 'model'}" in r.stdout
