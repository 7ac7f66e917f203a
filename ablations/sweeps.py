"""The sweeps behind ``make reproduce-table*``: train (Hydra multirun), evaluate, aggregate.

    python -m ablations.sweeps table3 --scale smoke            # what `make reproduce-table3` runs
    python -m ablations.sweeps table15 --scale paper --launcher slurm
    python -m ablations.sweeps table3 --scale smoke --dry-run  # print the commands only

A sweep is a list of Hydra multiruns of ``python -m unifiedplayers.train`` (``SWEEPS`` below: the
``conf/ablation/<preset>`` overlay plus the member overrides, comma lists being Hydra sweeps). Every
member gets ``resume=true`` and a run directory named by its overrides
(``hydra.sweep.subdir=${hydra.job.override_dirname}`` in the presets), so rerunning an interrupted
sweep skips the finished members (the loop returns at once for a finished run) and resumes a partial
one from its last completed update. Then ``ablations.evaluate_runs`` evaluates every finished member not
yet evaluated, and ``ablations.aggregate`` prints the table (markdown and LaTeX) with the paper's numbers.

Scales (``SCALES``): ``smoke`` = ``experiment=ablation_smoke`` + ``eval=ablation_smoke`` (CPU, toy sizes);
``paper`` = ``experiment=paper_qwen3_4b`` + ``eval=paper`` (GPUs); ``paper_mimo_7b`` = ``experiment=paper_mimo_7b``
+ ``eval=paper`` (the paper's MiMo-7B-Base rows). A scale's ``backbone`` only chooses which of the paper's
rows are printed for reference: each of our rows is labelled with the backbone it ran on. Launchers: ``local`` (joblib,
``--jobs`` members at a time) and ``slurm`` (submitit; ``pip install -e '.[slurm]'``; its settings are in
``ablations/conf/hydra/launcher/slurm.yaml``, outside ``conf/`` so that the configuration tests never need
the plugin).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
LAUNCHER_CONF = REPO / "ablations" / "conf"


@dataclass(frozen=True)
class Scale:
    experiment: str  # conf/experiment preset of every member
    eval: str  # conf/eval preset of the evaluation step
    seeds: str  # Hydra sweep of the paired seeds (Table 3)
    stale_seeds: str  # seeds of the stale-feedback control
    backbone: Optional[str] = None  # paper backbone whose Table 1 rows are printed beside ours
    eval_overrides: tuple[str, ...] = ()  # further conf/evaluate.yaml overrides of the evaluation step


SCALES = {
    # 15 runs for Table 3: 4 configurations x 3 seeds + the stale control on the same 3 paired seeds (from a
    # fresh clone, set-up included, about 40 min on 2 cores).
    "smoke": Scale("ablation_smoke", "ablation_smoke", "0,1,2", "0,1,2", backbone="Qwen3-4B-Base"),
    "paper": Scale("paper_qwen3_4b", "paper", "0,1,2", "0,1,2", backbone="Qwen3-4B-Base"),
    # The paper's second backbone (Tables 1 and 2, lower half): conf/experiment/paper_mimo_7b.yaml.
    "paper_mimo_7b": Scale("paper_mimo_7b", "paper", "0,1,2", "0,1,2", backbone="MiMo-7B-Base"),
    # Tests: the tiny random Llama, a few problems, a few tokens.
    "tiny": Scale("tiny", "ablation_smoke", "0,1", "0", eval_overrides=(
        "eval.limit=2", "eval.max_new_tokens=8", "eval.tool.max_turns=1", "eval.chat_template=false")),
}


@dataclass(frozen=True)
class Sweep:
    name: str  # also the table's key in ablations.aggregate and the W&B group prefix
    runs: tuple[tuple[str, ...], ...]  # one Hydra multirun per entry: the ablation preset + member overrides
    eval_only_methods: tuple[str, ...] = ()  # methods evaluated on the backbone without training (Table 1)
    adv_reject: bool = False  # also measure Adv. Reject on the fixed held-out set (Table 15)
    notes: str = ""

    def multiruns(self, scale: Scale) -> list[list[str]]:
        return [[o.format(seeds=scale.seeds, stale_seeds=scale.stale_seeds) for o in run] for run in self.runs]


SWEEPS = {
    "table3": Sweep("table3", (
        ("ablation=table3", "schedule.train_planning=true,false", "schedule.train_evaluation=true,false", "seed={seeds}"),
        ("ablation=table3_stale", "schedule.feedback=stale", "seed={stale_seeds}"),
    )),
    "table5": Sweep("table5", (
        ("ablation=table5", "seed=0"),  # the full method
        ("ablation=table5", "perturbation=none", "seed=0"),
        ("ablation=table5", "player.num_verifiers=1", "seed=0"),
        ("ablation=table5", "reward.use_verifiability=false", "seed=0"),
        ("ablation=table5", "reward=no_diversity", "seed=0"),
        ("ablation=table5", "schedule.outer_iterations=1", "seed=0"),
    ), notes="Single Iteration differs from the full method only where the scale has more than one outer iteration"),
    "table15": Sweep("table15", (("ablation=table15", "perturbation=all,local,global,none", "seed=0"),),
                     adv_reject=True),
    "table16": Sweep("table16", (("ablation=table16", "player.num_verifiers=1,2,4,8", "seed=0"),)),
    "table17": Sweep("table17", (
        ("ablation=table17", "reward=default,gold_heavy,adv_heavy,high_diversity,no_diversity", "seed=0"),)),
    "table1": Sweep("table1", (("ablation=table1", "method=unifiedplayers,agent0,r_zero,absolute_zero", "seed=0"),),
                    eval_only_methods=("vanilla", "tool_augmented")),
}
# Table 1's Socratic-Zero member: its Teacher is an external model, so it joins only with an endpoint.
SOCRATIC_ZERO_RUN = ("ablation=table1", "method=socratic_zero", "seed=0")


def socratic_zero_run(endpoint: Optional[str], model: Optional[str]) -> Optional[tuple[str, ...]]:
    """The Socratic-Zero multirun of Table 1 with its Teacher, or None (with why) when none is configured."""
    if not endpoint and not model:
        return None
    if not endpoint or not model:
        raise SystemExit("[sweep] Socratic-Zero needs both --teacher-endpoint and --teacher-model")
    return (*SOCRATIC_ZERO_RUN, f"method.teacher_endpoint={endpoint}", f"method.teacher_model={model}")


def sweep_dir(sweep: Sweep, scale: Scale, root: Path = REPO / "runs" / "ablations") -> Path:
    """Where the presets put the members (``hydra.sweep.dir`` of conf/ablation/<sweep>.yaml)."""
    return root / scale.experiment / sweep.name


def train_command(run: Sequence[str], scale: Scale, out: Path, launcher: str, jobs: int,
                  extra: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "unifiedplayers.train", "-m", *run, f"experiment={scale.experiment}", "resume=true",
           f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra.job.override_dirname}"]
    if launcher == "local":
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    elif launcher == "slurm":
        cmd += [f"hydra.searchpath=[file://{LAUNCHER_CONF}]", "hydra/launcher=slurm"]
    elif launcher != "basic":
        raise ValueError(f"launcher {launcher!r}: local | slurm | basic")
    return cmd + list(extra)


def write_eval_only_members(sweep: Sweep, scale: Scale, out: Path, extra: Sequence[str] = ()) -> list[Path]:
    """A run directory (config.yaml only) per evaluation-only method: evaluate_runs scores the backbone."""
    from omegaconf import OmegaConf

    from unifiedplayers.config import compose

    made = []
    for method in sweep.eval_only_methods:
        d = out / f"method={method}"
        if not (d / "config.yaml").exists():
            cfg = compose([f"ablation={sweep.name}", f"experiment={scale.experiment}", f"method={method}", *extra])
            d.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(cfg, d / "config.yaml", resolve=True)
        made.append(d)
    return made


def run(cmd: list[str], dry_run: bool, retries: int = 0) -> None:
    """Run one step; a failed training multirun is rerun up to ``retries`` times (its members resume: one
    member killed by the OOM killer, say, aborts the whole joblib pool, not the finished members' work)."""
    print("[sweep] $ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if dry_run:
        return
    for attempt in range(retries + 1):
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
        print(f"[sweep] ({time.time() - t0:.0f}s, exit {proc.returncode})", flush=True)
        if proc.returncode == 0:
            return
        if attempt < retries:
            print(f"[sweep] retrying (members resume from their last completed update), {retries - attempt} left",
                  flush=True)
    raise subprocess.CalledProcessError(proc.returncode, cmd)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Train, evaluate and aggregate one of the paper's sweeps")
    ap.add_argument("sweep", choices=sorted(SWEEPS))
    ap.add_argument("--scale", choices=sorted(SCALES), default="smoke")
    ap.add_argument("--launcher", choices=["local", "slurm", "basic"], default="local")
    ap.add_argument("--jobs", type=int, default=2, help="local launcher: members trained at a time")
    ap.add_argument("--eval-threads", type=int, default=1, help="torch threads per evaluation process")
    ap.add_argument("--steps", default="train,evaluate,aggregate", help="comma list of steps to run")
    ap.add_argument("--root", default=str(REPO / "runs" / "ablations"), help="sweeps go to ROOT/<experiment>/<sweep>")
    ap.add_argument("--retries", type=int, default=1, help="reruns of a failed training multirun (members resume)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--teacher-endpoint", default=None,
                    help="table1: an OpenAI-compatible endpoint for Socratic-Zero's Teacher (e.g. http://host:8000/v1)")
    ap.add_argument("--teacher-model", default=None, help="table1: the Teacher's model name at that endpoint")
    ap.add_argument("overrides", nargs="*", help="extra training overrides for every member")
    args = ap.parse_intermixed_args(argv)
    sweep, scale = SWEEPS[args.sweep], SCALES[args.scale]
    out = sweep_dir(sweep, scale, Path(args.root).resolve())
    steps = set(args.steps.split(","))
    t0 = time.time()
    if sweep.notes:
        print(f"[sweep] {sweep.name}: {sweep.notes}")
    multiruns = sweep.multiruns(scale)
    if sweep.name == "table1":
        socratic = socratic_zero_run(args.teacher_endpoint, args.teacher_model)
        if socratic is None:
            print("[sweep] table1: Socratic-Zero is left out: no Teacher endpoint configured "
                  "(ARGS=\"--teacher-endpoint URL --teacher-model NAME\")", flush=True)
        else:
            print(f"[sweep] table1: Socratic-Zero joins with the Teacher {args.teacher_model} at "
                  f"{args.teacher_endpoint}", flush=True)
            multiruns.append(list(socratic))
    if "train" in steps:
        for mr in multiruns:
            run(train_command(mr, scale, out, args.launcher, args.jobs, args.overrides), args.dry_run, args.retries)
        if sweep.eval_only_methods and not args.dry_run:
            write_eval_only_members(sweep, scale, out, args.overrides)
    py = [sys.executable, "-m"]
    if "evaluate" in steps:
        run(py + ["ablations.evaluate_runs", str(out), "--eval", scale.eval, "--threads", str(args.eval_threads),
                   "--jobs", str(args.jobs if args.launcher == "local" else 1),
                   *(["--adv-reject"] if sweep.adv_reject else []), *scale.eval_overrides],
            args.dry_run)
    if "aggregate" in steps:
        cmd = py + ["ablations.aggregate", sweep.name, str(out)]
        if sweep.name == "table1" and scale.backbone:
            cmd += ["--backbone", scale.backbone]
        run(cmd, args.dry_run)
    print(f"[sweep] {sweep.name} ({args.scale}) finished in {time.time() - t0:.0f}s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
