"""`python -m unifiedplayers.train` (the Hydra entry point behind `make run`) on the tiny preset."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu


def test_hydra_entry_point_runs_in_its_output_dir_and_resumes(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "unifiedplayers.train", "experiment=tiny", f"hydra.run.dir={out}",
           "schedule.planning_updates=0", "schedule.evaluation_updates=0", "trainer.num_threads=1",
           "schedule.print_summary=true", "schedule.summary_png=true"]
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Verdict matrix" in first.stdout and "Mean reward per update" in first.stdout
    assert json.loads((out / "summary.json").read_text())["updates"] == 1
    assert (out / "records.jsonl").exists() and (out / ".hydra" / "config.yaml").exists()
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the tiny preset draws none by default
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode != 0 and "resume=true" in again.stderr  # never overwrites a run
    resumed = subprocess.run(cmd + ["resume=true"], capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0 and "already complete" in resumed.stdout, resumed.stderr[-3000:]


def test_a_bare_run_says_it_trains_the_defaults_not_a_paper_preset():
    """Without experiment= (where it may start: a GPU machine) the first line names the model,
    its device and the update count of conf/config.yaml's defaults, and the paper presets."""
    from unifiedplayers.config import compose
    from unifiedplayers.train import default_run_notice

    notice = default_run_notice([], compose([]))
    assert "SmolLM2-135M-Instruct on cpu" in notice and "2,100 updates" in notice and "not a paper preset" in notice
    assert "experiment=paper_qwen3_4b" in notice and "experiment=smoke" in notice
    assert "Qwen3-4B-Base on cuda" in default_run_notice(["model=qwen3_4b_base", "model.device=cuda"],
                                                         compose(["model=qwen3_4b_base", "model.device=cuda"]))
    assert default_run_notice(["experiment=smoke"], compose(["experiment=smoke"])) is None  # what `make run` runs
    assert default_run_notice(["+experiment=tiny"], compose(["experiment=tiny"])) is None


def test_the_entry_point_lets_idle_openmp_threads_sleep_unless_told_otherwise():
    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: the entry point sets it only where torch is not yet
    # imported, and never over the caller's own policy.
    def policy(code: str, **extra: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | extra
        done = subprocess.run([sys.executable, "-c", code + "; print(os.environ.get('OMP_WAIT_POLICY'))"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    assert policy("import os, unifiedplayers.train, torch") == "PASSIVE"
    assert policy("import os, unifiedplayers.train", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert policy("import os, torch, unifiedplayers.train") == "None"  # too late to take effect: left alone
