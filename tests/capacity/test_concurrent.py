"""Runs started together on one node (unifiedplayers.capacity.concurrent, experiments/dp8_single_gpu_runs.sh): their
host RAM and disk summed against the node, the first that fit started, the others left for later."""
from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from unifiedplayers.capacity import GB, GiB, TB, Hardware, Need, plan, run_need, runs_that_fit
from unifiedplayers.capacity.report import main
from unifiedplayers.config import compose

ROOT = Path(__file__).resolve().parents[2]
ONE_GPU = Hardware(gpus=1, host_ram=512 * GiB, disk=2 * TB, name="a fake node")


@pytest.fixture(scope="module")
def plans():
    """A full member of Table 3 and one whose Evaluation player is frozen, each on one GPU."""
    full = plan(compose(["experiment=paper_qwen3_4b"]), ONE_GPU)
    frozen = plan(compose(["experiment=paper_qwen3_4b", "schedule.train_evaluation=false"]), ONE_GPU)
    return full, frozen


def test_a_runs_need_and_the_sum_by_hand(plans):
    full, frozen = plans
    need = run_need(full, ONE_GPU)
    assert need == Need(full.host_peak.total, full.run_disk + full.parked.bytes, 0.0)
    assert 88 * GiB < need.host_ram < 89 * GiB and 925e9 < need.disk < 926e9  # the one-GPU figures of `make plan`
    # trainer.offload_dir on a file system of its own: the parked state counts there, not on the run's disk
    apart = run_need(full, replace(ONE_GPU, offload_disk=1 * TB))
    assert apart == Need(need.host_ram, full.run_disk, full.parked.bytes)
    together = run_need(full, ONE_GPU) + run_need(frozen, ONE_GPU)
    assert together.host_ram == full.host_peak.total + frozen.host_peak.total
    assert together.disk == full.run_disk + full.parked.bytes + frozen.run_disk + frozen.parked.bytes
    assert frozen.run_disk + frozen.parked.bytes < full.run_disk + full.parked.bytes  # a frozen player saves nothing


def test_as_many_as_fit_in_order(plans):
    """The first runs whose sums stay within the node: exactly enough for both, one byte short of either sum, and
    eight full runs on the paper's node (2 TB of disk holds two)."""
    full, frozen = plans
    sum_ = run_need(full, ONE_GPU) + run_need(frozen, ONE_GPU)
    exact = replace(ONE_GPU, host_ram=sum_.host_ram, disk=sum_.disk)
    assert runs_that_fit([full, frozen], exact) == 2
    assert runs_that_fit([full, frozen], replace(exact, host_ram=sum_.host_ram - 1)) == 1
    assert runs_that_fit([full, frozen], replace(exact, disk=sum_.disk - 1)) == 1
    assert runs_that_fit([full, frozen], replace(exact, disk=1e9)) == 0
    assert runs_that_fit([full] * 8, ONE_GPU) == 2  # 3 x 925 GB > 2 TB
    assert runs_that_fit([full] * 8, replace(ONE_GPU, disk=8 * TB)) == 5  # 6 x 88.4 GiB > 512 GiB
    assert runs_that_fit([full] * 8, replace(ONE_GPU, disk=8 * TB, host_ram=800 * GiB)) == 8


def test_the_command_line_sums_n_runs(capsys):
    """--runs 8 on a fake small machine: the table of running sums, how many fit and the limit the next passes."""
    assert main(["experiment=paper_qwen3_4b", "--gpus", "1", "--runs", "8", "--host-ram-gb", "200",
                 "--disk-tb", "8"]) == 1
    out = capsys.readouterr().out
    assert "8 run(s) started together on one node" in out and "Together: 707 GiB host RAM and 7.40 TB disk" in out
    assert "2 of 8 fit together (+); with the next, the first 3 would need 265.3 GiB host RAM > 200.0 GiB" in out
    assert [line[:1] for line in out.splitlines() if line.startswith(("+ run", "- run"))] == ["+"] * 2 + ["-"] * 6
    assert main(["experiment=paper_qwen3_4b", "--gpus", "1", "--runs", "8", "--host-ram-gb", "800",
                 "--disk-tb", "8"]) == 0
    assert "All 8 fit." in capsys.readouterr().out


def test_the_command_line_passes_on_the_members_that_fit(monkeypatch, capsys, tmp_path):
    """--members -: one run a line (a label, then its overrides, shell words); standard output gets the lines of the
    members that fit, as they came, and the table goes to standard error."""
    lines = [f"{tmp_path / name} experiment=paper_qwen3_4b {extra} " + shlex.quote(f"run_dir='{tmp_path / name}'")
             for name, extra in (("a=1,b", "seed=0"), ("frozen", "schedule.train_evaluation=false"), ("c", "seed=2"))]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n\n"))
    assert main(["--members", "-", "--gpus", "1", "--host-ram-gb", "200", "--disk-tb", "8"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == lines[:2]
    assert "+ a=1,b " in captured.err and "+ frozen " in captured.err and "- c " in captured.err
    monkeypatch.setattr(sys, "stdin", io.StringIO("x experiment=paper_qwen3_4b model.nosuchkey=1\n"))
    assert main(["--members", "-", "--gpus", "1"]) == 2
    assert "nosuchkey" in capsys.readouterr().err


def _fake_python(tmp_path: Path) -> Path:
    """A PY for the script: the training runs only print their GPU and arguments; everything else is Python."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    "if [ \"$1 $2\" = '-m unifiedplayers.train' ]; then\n"
                    "  echo \"GPU=$CUDA_VISIBLE_DEVICES $*\"; exit 0\n"
                    "fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake


def test_dp8_single_gpu_runs_starts_only_what_fits_the_node(tmp_path):
    """experiments/dp8_single_gpu_runs.sh on a node of 200 GiB host RAM (CAPACITY_MACHINE): two of the eight members
    fit together, so it starts those two (GPUs 0 and 1, each with its own trainer.offload_dir under its run
    directory) and says how to start the rest; run again while one of them runs, it starts nothing. (Two launches of
    the script, each listing Table 3's members: ~10 s.)"""
    model = tmp_path / "Qwen3-4B-Base"
    model.mkdir()
    (model / "config.json").write_text((ROOT / "conf/model/arch/qwen3_4b_base.json").read_text())
    root = tmp_path / "ablations"
    env = {**os.environ, "PY": str(_fake_python(tmp_path)), "MODEL_PATH": str(model), "ABLATION_ROOT": str(root),
           "CAPACITY_MACHINE": "--host-ram-gb 200 --disk-tb 8"}
    script = ROOT / "experiments" / "dp8_single_gpu_runs.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 8 fit together" in r.stderr and "started 2 of the 8 members" in r.stdout
    started = sorted(root.glob("paper_qwen3_4b/table3/*/launch.pid"))
    assert len(started) == 2
    for pid_file in started:
        run_dir = pid_file.parent
        while Path(f"/proc/{pid_file.read_text().strip()}").exists():
            time.sleep(0.05)
        log = (run_dir / "launch.log").read_text()
        assert f"trainer.offload_dir='{run_dir}/offload'" in log and "schedule.train_evaluation=True" in log
    assert {(p.parent / "launch.log").read_text().split("GPU=")[1][0] for p in started} == {"0", "1"}
    # One of them still running (a process whose command names the training module and its run directory)
    sleeper = subprocess.Popen(["bash", "-c", "sleep 60; true", "unifiedplayers.train", str(started[0].parent)])
    try:
        started[0].write_text(f"{sleeper.pid}\n")
        again = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
    finally:
        sleeper.kill()
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"still running: {started[0].parent}" in again.stdout and "nothing more is started" in again.stdout
    assert "GPU" not in again.stdout
