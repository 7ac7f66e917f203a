"""The sweep launcher: member lists compose, commands resume, evaluation skips what is done or unfinished.
(An end-to-end tiny sweep trains real runs and is left to `python -m ablations.sweeps table15 --scale tiny`.)"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ablations import evaluate_runs, sweeps
from unifiedplayers.config import CONF_DIR, compose

GROUPS = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def expand(run: list[str]) -> list[list[str]]:
    """The members of one Hydra multirun: the product of its comma lists."""
    choices = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")] for o in run]
    return [list(c) for c in itertools.product(*choices)]


@pytest.mark.parametrize("name", sorted(sweeps.SWEEPS))
def test_every_member_is_a_valid_override_set(name):
    sweep, scale = sweeps.SWEEPS[name], sweeps.SCALES["smoke"]
    members = [m for run in sweep.multiruns(scale) for m in expand(run)]
    for m in members:  # group options exist (reward=no_diversity, perturbation=local, method=agent0, ...)
        for o in m:
            key, value = o.split("=", 1)
            if key in GROUPS:
                assert (CONF_DIR / key / f"{value}.yaml").exists(), o
    for run in sweep.multiruns(scale):  # the first member of each multirun composes against the schema
        cfg = compose(expand(run)[0] + [f"experiment={scale.experiment}"])
        assert cfg.ablation.startswith(name)
        assert cfg.logger.group == f"{name}-{scale.experiment}" and name in cfg.logger.tags
    dirs = ["-".join(sorted(m)) for m in members]
    assert len(dirs) == len(set(dirs)), "two members would share a run directory"


def test_table3_members_and_scales():
    smoke = [m for run in sweeps.SWEEPS["table3"].multiruns(sweeps.SCALES["smoke"]) for m in expand(run)]
    assert len(smoke) == 15  # 2 x 2 x 3 seeds + the stale control on the same 3 seeds
    assert sum("schedule.feedback=stale" in m for m in smoke) == 3
    paper = [m for run in sweeps.SWEEPS["table3"].multiruns(sweeps.SCALES["paper"]) for m in expand(run)]
    assert len(paper) == 15 and sum("schedule.feedback=stale" in m for m in paper) == 3
    assert (CONF_DIR / "experiment" / f"{sweeps.SCALES['paper'].experiment}.yaml").exists()
    assert (CONF_DIR / "eval" / f"{sweeps.SCALES['smoke'].eval}.yaml").exists()


def test_train_command_resumes_into_named_member_dirs(tmp_path):
    run = sweeps.SWEEPS["table15"].multiruns(sweeps.SCALES["smoke"])[0]
    cmd = sweeps.train_command(run, sweeps.SCALES["smoke"], tmp_path, "local", 2)
    assert cmd[1:4] == ["-m", "unifiedplayers.train", "-m"]
    assert "resume=true" in cmd and f"hydra.sweep.dir={tmp_path}" in cmd
    assert "hydra.sweep.subdir=${hydra.job.override_dirname}" in cmd
    assert "hydra/launcher=joblib" in cmd and "hydra.launcher.n_jobs=2" in cmd
    slurm = sweeps.train_command(run, sweeps.SCALES["paper"], tmp_path, "slurm", 1)
    assert "hydra/launcher=slurm" in slurm and any(c.startswith("hydra.searchpath=") for c in slurm)
    assert (sweeps.LAUNCHER_CONF / "hydra" / "launcher" / "slurm.yaml").exists()
    with pytest.raises(ValueError, match="launcher"):
        sweeps.train_command(run, sweeps.SCALES["smoke"], tmp_path, "cloud", 1)


def test_dry_run_prints_every_step(capsys, tmp_path):
    sweeps.main(["table3", "--dry-run", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("unifiedplayers.train -m") == 2
    assert "ablations.evaluate_runs" in out and "ablations.aggregate table3" in out
    assert not any(tmp_path.iterdir())  # nothing ran


def test_eval_only_members_and_evaluation_skips(tmp_path, capsys):
    made = sweeps.write_eval_only_members(sweeps.SWEEPS["table1"], sweeps.SCALES["tiny"], tmp_path)
    assert [d.name for d in made] == ["method=vanilla", "method=tool_augmented"]
    cfg = OmegaConf.load(made[0] / "config.yaml")
    assert cfg.method.name == "vanilla" and not cfg.method.trainable
    ecfg = evaluate_runs.eval_config(cfg, "ablation_smoke")
    assert ecfg.eval.modes == ["vanilla"] and ecfg.eval.method == "Vanilla" and ecfg.model.name == cfg.model.name
    assert evaluate_runs.eval_config(OmegaConf.load(made[1] / "config.yaml"), "ablation_smoke").eval.modes == ["tool"]
    # a trainable run without summary.json is skipped, an evaluated one too; neither loads a model
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    OmegaConf.save(compose(["experiment=tiny"]), unfinished / "config.yaml")
    assert evaluate_runs.evaluate_run(unfinished, "ablation_smoke") is None
    (made[0] / "eval").mkdir()
    (made[0] / "eval" / "results.json").write_text("{}")
    assert evaluate_runs.evaluate_run(made[0], "ablation_smoke") is None
    out = capsys.readouterr().out
    assert "training not finished" in out and "already evaluated" in out


def test_a_failed_step_is_retried_then_reported(tmp_path, capsys):
    import sys

    marker = tmp_path / "ran"
    # fails on its first run, succeeds on the second (like a multirun whose members resume)
    flaky = [sys.executable, "-c",
             f"import pathlib,sys; p=pathlib.Path({str(marker)!r}); first=not p.exists(); p.touch(); sys.exit(1 if first else 0)"]
    sweeps.run(flaky, dry_run=False, retries=1)
    assert "retrying" in capsys.readouterr().out
    with pytest.raises(Exception, match="returned non-zero exit status 3"):
        sweeps.run([sys.executable, "-c", "import sys; sys.exit(3)"], dry_run=False, retries=1)
