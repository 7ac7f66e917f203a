"""The sweep launcher: member lists compose, commands resume, evaluation skips what is done or unfinished; at the
GPU scales one member at a time over all GPUs (torchrun) or whole Slurm nodes each, in the directories that a
Hydra multirun and experiments/dp8_single_gpu_runs.sh use. (An end-to-end tiny sweep trains real runs and is left
to `python -m ablations.sweeps table15 --scale tiny`.)"""
from __future__ import annotations

import itertools
import os
import shlex
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
    slurm = sweeps.train_command(run, sweeps.SCALES["smoke"], tmp_path, "slurm", 1)
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


# --------------------------------------------------------------------------------------------------
# GPU scales: member by member


def _launched(out: str) -> list[list[str]]:
    """The training commands a dry run printed, as argv lists."""
    return [shlex.split(line.split("$ ", 1)[1]) for line in out.splitlines()
            if line.startswith("[sweep] $ ") and "unifiedplayers.train" in line]


def test_paper_scale_runs_one_member_at_a_time_over_all_gpus(capsys, tmp_path):
    sweeps.main(["table3", "--scale", "paper", "--dry-run", "--root", str(tmp_path), "model.path=/models/q"])
    cmds = _launched(capsys.readouterr().out)
    assert len(cmds) == 15  # every member its own command, run one after the other: no joblib pool of members
    for c in cmds:
        assert c[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"], c
        assert "model.path=/models/q" in c and "experiment=paper_qwen3_4b" in c and "-m" not in c[6:]
        assert not any("joblib" in a or a.startswith("hydra.") for a in c)
    # run_dir as Hydra reads it (the directory names hold = and ,)
    dirs = [compose(c[c.index("unifiedplayers.train") + 1:]).run_dir for c in (cmds[0], cmds[-1])]
    assert len({next(a for a in c if a.startswith("run_dir=")) for c in cmds}) == 15
    # named as Hydra's multirun names them (override_dirname: sorted, the backbone's path left out)
    table3 = tmp_path / "paper_qwen3_4b" / "table3"
    assert dirs[0] == str(table3 / "schedule.train_evaluation=True,schedule.train_planning=True,seed=0")
    assert dirs[-1] == str(table3 / "schedule.feedback=stale,seed=2")
    # the stale control cannot run ZeRO-3 over several ranks (checks.check_ranks): ZeRO-2, the same update
    stale = [c for c in cmds if "schedule.feedback=stale" in c]
    assert len(stale) == 3 and all("trainer.backend=deepspeed_zero2" in c for c in stale)
    assert not any("trainer.backend=deepspeed_zero2" in c for c in cmds if c not in stale)
    one = sweeps.main(["table16", "--scale", "paper", "--dry-run", "--root", str(tmp_path), "--nproc-per-node", "1"])
    assert one == 0 and all(c[1:3] == ["-m", "unifiedplayers.train"] for c in _launched(capsys.readouterr().out))


def test_members_are_the_dirs_of_a_hydra_multirun_and_resume_with_their_rank_count(tmp_path, capsys):
    """A real multirun (the CPU scales' launch) makes the directories; the member list finds them, resumes each
    with the rank count its run began with, and leaves a finished one alone unless its config changed."""
    import subprocess
    import sys

    import torch

    scale = sweeps.SCALES["tiny"]
    run = ("ablation=table16", "player.num_verifiers=1,2", "seed=0")
    extra = ["schedule.max_updates=1", "trainer.num_threads=1", "model.path=/not/used/by/tiny"]
    cmd = sweeps.train_command(run, scale, tmp_path, "basic", 1, extra)
    proc = subprocess.run(cmd, cwd=sweeps.REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = sorted(p.parent for p in tmp_path.glob("*/state.pt"))
    assert [p.name for p in made] == ["player.num_verifiers=1,seed=0", "player.num_verifiers=2,seed=0"]
    found = sweeps.members([run], scale, tmp_path, 8, extra)
    assert sorted(m.run_dir for m in found) == made
    assert all(m.ranks == 1 and not m.finished for m in found)  # begun with one process: resumed with one
    assert found[0].command()[:3] == [sys.executable, "-m", "unifiedplayers.train"]
    resumed = subprocess.run(found[0].command(), cwd=sweeps.REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # the member's own command resumes its run
    assert torch.load(made[0] / "state.pt", weights_only=False)["completed"] == 2
    state = torch.load(made[0] / "state.pt", weights_only=False)
    state["finished"] = True
    torch.save(state, made[0] / "state.pt")
    found = sweeps.members([run], scale, tmp_path, 8, extra)
    assert [m.finished for m in found] == [True, False]
    sweeps.run_members_here(found, 8, dry_run=True, retries=0)
    out = capsys.readouterr().out
    assert f"finished, not launched: {made[0]}" in out and len(_launched(out)) == 1
    with pytest.raises(ValueError, match="different config"):  # the same directory, another backbone
        sweeps.members([run], scale, tmp_path, 8, [*extra[:-1], "model.path=/another/backbone"])


class FakeJob:
    def __init__(self, fn, n):
        self.fn, self.job_id = fn, str(n)

    def results(self):  # every task's (submitit's result() refuses a job of several tasks)
        if "fail" in self.fn.member.overrides:
            raise RuntimeError("Job failed\nsubprocess exited 1")


class FakeSlurmExecutor:
    """submitit.SlurmExecutor's interface, recording what would be submitted."""
    submitted: list = []

    def __init__(self, folder):
        self.folder, self.params = folder, {}

    def update_parameters(self, **params):
        self.params.update(params)

    def submit(self, fn):
        FakeSlurmExecutor.submitted.append((self.params, fn))
        return FakeJob(fn, len(FakeSlurmExecutor.submitted))


def test_slurm_gives_a_paper_member_a_whole_node(tmp_path, capsys):
    settings = sweeps.slurm_settings()
    # the paper: 312-432 A100-hours per run on 8 GPUs, 39-54 h of the node; the limit leaves a margin over 54 h
    assert settings["time"] >= 1.5 * 54 * 60 and settings["nodes"] == 1 and settings["ntasks_per_node"] == 1
    assert settings["exclusive"] is True and settings["mem"] == "0"
    assert sweeps.slurm_settings(["partition=gpu", "time=2880"])["partition"] == "gpu"
    out = tmp_path / "table3"
    found = [sweeps.Member(("seed=0", "model.path=/m"), out / "seed=0", 8),
             sweeps.Member(("seed=1",), out / "seed=1", 8, finished=True),
             sweeps.Member(("seed=2", "fail"), out / "seed=2", 1)]
    FakeSlurmExecutor.submitted = []
    with pytest.raises(SystemExit, match=r"seed=2 \(job 2: subprocess exited 1\)"):
        sweeps.run_members_on_slurm(found, "table3", out, ["partition=gpu"], dry_run=False,
                                    executor=FakeSlurmExecutor)
    (p0, f0), (p1, f1) = FakeSlurmExecutor.submitted  # the finished member is not submitted
    assert p0["gpus_per_node"] == 8 and p0["nodes"] == 1 and p0["ntasks_per_node"] == 1 and p0["partition"] == "gpu"
    assert p0["time"] == settings["time"] and p0["exclusive"] is True and p0["job_name"] == "table3-seed=0"
    assert f0.command() == found[0].command() and "--nproc_per_node=8" in f0.command()  # torchrun inside the job
    assert "--standalone" in f0.command()  # its own rendezvous port: two jobs on one node never meet
    assert p1["gpus_per_node"] == 1 and f1.command() == found[2].command()
    assert "finished, not submitted" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="gpus_per_node"):  # a node's GPUs are the member's ranks on it
        sweeps.slurm_settings(["gpus_per_node=4"])


def test_slurm_runs_a_member_across_nodes_with_torchrun_on_each(tmp_path, capsys, monkeypatch):
    """``--slurm nodes=2``: one job of two whole nodes, one task each; each task runs torchrun with its node rank
    (SLURM_NODEID) and the rendezvous at the job's first host."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # scontrol show hostnames gpu[07-08] -> gpu07, gpu08
    scontrol.write_text('#!/bin/bash\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "table3"
    member = sweeps.Member(("seed=0",), out / "seed=0", 16, nodes=2)
    FakeSlurmExecutor.submitted = []
    sweeps.run_members_on_slurm([member], "table3", out, ["nodes=2"], dry_run=False, executor=FakeSlurmExecutor)
    [(params, job)] = FakeSlurmExecutor.submitted
    assert params["nodes"] == 2 and params["ntasks_per_node"] == 1 and params["gpus_per_node"] == 8
    slurm = {"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242"}
    node1 = job.command(slurm)
    assert node1[:10] == [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1",
                          "--rdzv_backend=static", "--rdzv_endpoint=gpu07:24242", "--rdzv_id=4242",
                          "--nproc_per_node=8", "-m"], node1
    assert node1[10:] == ["unifiedplayers.train", *member.train_args()]
    assert "--node_rank=0" in job.command({**slurm, "SLURM_NODEID": "0"})
    assert "on each node, node 0's command" in capsys.readouterr().out

    sweeps.main(["table16", "--scale", "paper", "--launcher", "slurm", "--slurm", "nodes=2", "--dry-run",
                 "--root", str(tmp_path), "model.path=/models/q", "--steps", "train"])
    jobs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[sweep] slurm job")]
    assert len(jobs) == 4 and all("nodes=2" in j and "gpus_per_node=8" in j and "--nnodes=2" in j for j in jobs)


def test_dp8_script_trains_members_where_the_table3_target_looks(tmp_path):
    """experiments/dp8_single_gpu_runs.sh starts the factorial of seeds 0 and 1, one per GPU, with the overrides and
    in the directories of `make reproduce-table3 SCALE=paper`'s members (a stand-in records the training calls)."""
    import os
    import subprocess
    import sys
    import time

    log, model = tmp_path / "train_calls", tmp_path / "Qwen3-4B-Base"
    model.mkdir()
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m unifiedplayers.train" ]; then echo "$CUDA_VISIBLE_DEVICES $*" >> {log}; exit 0; fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    root = tmp_path / "ablations"
    # CAPACITY_CHECK=false: all eight start here (the sum check itself: tests/capacity/test_concurrent.py)
    env = {**os.environ, "PY": str(fake), "MODEL_PATH": str(model), "ABLATION_ROOT": str(root),
           "CAPACITY_CHECK": "false"}
    proc = subprocess.run(["bash", str(sweeps.REPO / "experiments" / "dp8_single_gpu_runs.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "make reproduce-table3 SCALE=paper" in proc.stdout
    for _ in range(100):  # the runs start in the background
        if log.exists() and len(log.read_text().splitlines()) == 8:
            break
        time.sleep(0.1)
    calls = [line.split() for line in log.read_text().splitlines()]
    assert sorted(c[0] for c in calls) == [str(i) for i in range(8)]  # one GPU each
    scale = sweeps.SCALES["paper"]
    out = sweeps.sweep_dir(sweeps.SWEEPS["table3"], scale, root)
    target = {str(m.run_dir): m for m in sweeps.members(sweeps.SWEEPS["table3"].multiruns(scale), scale, out, 8,
                                                         [f"model.path={model}"])}
    for c in calls:
        cfg = compose(c[3:])  # the overrides as the training entry point reads them
        assert cfg.run_dir in target and (Path(cfg.run_dir) / "launch.log").exists(), cfg.run_dir
        own = ("run_dir=", "trainer.offload_dir=")  # run-control keys: where it runs and where idle state waits
        assert tuple(o for o in c[3:] if not o.startswith(own)) == target[cfg.run_dir].overrides  # the same config
        assert cfg.trainer.offload_dir == str(Path(cfg.run_dir) / "offload")  # each run its own
        assert cfg.seed in (0, 1) and cfg.schedule.feedback == "fresh" and cfg.model.path == str(model)
