"""`make reproduce-figure1-ablation` (eval/probes/figure1_ablation.py): both arms trained and probed on the tiny
model, figure1_ablation.json's shape, the plot, the path printed last, and a rerun that trains nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.probes import figure1 as F
from eval.probes import figure1_ablation as A

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROBE_ARGS = ("--execution 2 --tool 2 --evaluation 2 --verifiers 1 --topics 1 --tasks-per-topic 2 "
              "--u-tasks 1 --u-samples 2")


def test_the_arms_jobs(tmp_path):
    jobs = A.arm_jobs(tmp_path, "tiny", [0, 1], ["x=1"], [], iterations=2)
    trains = [j for j in jobs if j.iteration < 0]
    assert [j.name for j in trains] == ["full: train seed 0", "full: train seed 1",
                                        "no_perturbation: train seed 0", "no_perturbation: train seed 1"]
    assert jobs[:4] == trains  # every training first
    for j in trains:
        arm = j.name.split(":")[0]
        assert f"run_dir={tmp_path / arm / f'seed{j.seed}'}" in j.argv and "x=1" in j.argv
        assert ("perturbation=none" in j.argv) == (arm == "no_perturbation")
    probes = jobs[4:]
    # the backbone once (first arm, first seed, three roles); then each arm x seed x iteration x role
    assert [(j.name.split(":")[0], j.seed) for j in probes if j.iteration == 0] == [("full", 0)] * 3
    assert len(probes) == 3 + 2 * 2 * 2 * 3
    assert [j.iteration for j in probes] == sorted(j.iteration for j in probes)


def test_an_override_of_the_perturbation_engine_is_refused(capsys):
    with pytest.raises(SystemExit):
        A.main(["--experiment", "tiny", "perturbation=local"])
    assert "the arms set the perturbation engine" in capsys.readouterr().err


def test_figure1_ablation_end_to_end_on_the_tiny_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(F, "POLL_S", 0.2)
    root = tmp_path / "abl"
    argv = ["--experiment", "tiny", "--root", str(root), "--seeds", "1", "--jobs", "2", "--probe-args", PROBE_ARGS,
            "schedule.outer_iterations=1"]
    rc = A.main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(out)
    path = Path(out[-1])  # the path of figure1_ablation.json is the last line
    assert path == root / "figure1_ablation.json"
    data = json.loads(path.read_text())
    assert data["iterations"] == [0, 1] and data["seeds"] == [0]
    assert list(data["arms"]) == ["full", "no_perturbation"]
    for arm, fig in data["arms"].items():
        assert list(fig["series"]) == list(F.SERIES), arm  # figure1.json's series, in its order
        assert {"execution/accuracy_tool", "evaluation/originals_accepted"} <= set(fig["series"])
        assert list(fig["per_seed"]) == ["0"]
        for key, values in fig["series"].items():
            assert len(values) == len(data["iterations"]) and values == fig["per_seed"]["0"][key], (arm, key)
        # the tool probe ran at both iterations (n = 2), and its binomial SE is reported as for the other series
        assert None not in fig["series"]["execution/accuracy_tool"]
        assert len(fig["probe_se"]["0"]["execution/accuracy_tool"]) == 2
        assert fig["sources"]["0"][1]["execution"].endswith(f"{arm}/seed0/checkpoints/iter1/execution/model.pt")
        assert json.loads((root / arm / "figure1.json").read_text())["series"] == fig["series"]
    full, ablated = data["arms"]["full"], data["arms"]["no_perturbation"]
    # the backbone is probed once and shared by both arms
    for key in F.SERIES:
        assert full["series"][key][0] == ablated["series"][key][0], key
    assert ablated["sources"]["0"][0]["execution"] == "backbone"
    assert data["arm_overrides"] == {"full": [], "no_perturbation": ["perturbation=none"]}
    # the arms differ by the perturbation engine only (conf/perturbation/none.yaml: no rule)
    from omegaconf import OmegaConf

    cfgs = {arm: OmegaConf.load(root / arm / "seed0" / "config.yaml") for arm in data["arms"]}
    assert list(cfgs["full"].perturbation.rules) and list(cfgs["no_perturbation"].perturbation.rules) == []
    assert (root / "figure1_ablation.png").read_bytes()[:8] == PNG_MAGIC
    # Run again: every member is finished, nothing is trained or probed again.
    rc = A.main(argv)
    again = capsys.readouterr().out
    assert rc == 0 and again.strip().splitlines()[-1] == str(path)
    assert again.count("already done") == 2 + 3 + 2 * 3  # two runs, the backbone, 2 arms x 3 roles at iteration 1
    assert "started" not in again
    assert json.loads(path.read_text())["arms"]["full"]["series"] == full["series"]


ROOT = Path(__file__).resolve().parents[2]


def test_the_make_target_and_the_launch_script(tmp_path):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "MAKEFLAGS", "MFLAGS")}
    made = subprocess.run(["make", "-n", "--no-print-directory", "reproduce-figure1-ablation", "SEEDS=2"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    cmd = " ".join(made.stdout.replace("\\\n", " ").split())
    assert "-m eval.probes.figure1_ablation --scale smoke --seeds 2 --jobs 2 --root runs/figure1_ablation/smoke" in cmd
    helped = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                            env=env, timeout=60)
    assert "make reproduce-figure1-ablation" in helped.stdout
    script = ROOT / "experiments" / "figure1_ablation.sh"
    assert os.access(script, os.X_OK) and subprocess.run(["bash", "-n", str(script)]).returncode == 0
    (tmp_path / "model").mkdir()
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=dict(env, PY="echo"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["-m", "eval.probes.figure1_ablation", "--scale", "smoke", "--seeds", "1", "--jobs", "2",
                                "--root", "runs/figure1_ablation/smoke"]
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env=dict(env, PY="echo", SCALE="paper", MODEL_PATH=str(tmp_path / "model")))
    assert "--scale paper --seeds 1 --jobs 1" in r.stdout and f"model.path={tmp_path / 'model'}" in r.stdout
