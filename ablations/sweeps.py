"""The sweeps behind ``make reproduce-table*``: train (Hydra multirun), evaluate, aggregate (docs/baselines.md).

    python -m ablations.sweeps table3 --scale smoke            # what `make reproduce-table3` runs
    python -m ablations.sweeps table15 --scale paper --launcher slurm
    python -m ablations.sweeps table3 --scale smoke --dry-run  # print the commands only
    python -m ablations.sweeps table3 --scale paper --nproc-per-node 8 model.path=DIR   # one member at a time
    python -m ablations.sweeps table3 --scale paper --launcher slurm --slurm nodes=2 model.path=DIR  # 2 nodes each

A sweep is a list of Hydra multiruns of ``python -m unifiedplayers.train`` (:data:`SWEEPS`). Every member gets
``resume=true`` and a run directory named by its overrides (``hydra.sweep.subdir=${hydra.job.override_dirname}``),
so rerunning an interrupted sweep skips the finished members and resumes a partial one; whichever launcher
started a member (or ``experiments/dp8_single_gpu_runs.sh``, ``--list-members``) finds it again. Then
``ablations.evaluate_runs`` evaluates the finished members and ``ablations.aggregate`` prints the table.

Launchers: ``local`` (joblib, ``--jobs`` members at a time) and ``slurm`` (submitit, ``pip install -e '.[slurm]'``,
settings in ``ablations/conf/``, outside ``conf/`` so that the configuration tests never need the plugin). At the GPU
scales a member is one run over a node's GPUs (:class:`Member`, docs/distributed.md).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import hydra
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from unifiedplayers import rundir
from unifiedplayers.config import CONF_DIR, check_override_keys, compose, register_configs

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
    gpus: bool = False  # a member is a run over a node's GPUs (torchrun), launched member by member


SCALES = {
    # 15 runs for Table 3: 4 configurations x 3 seeds + the stale control on the same 3 paired seeds.
    "smoke": Scale("ablation_smoke", "ablation_smoke", "0,1,2", "0,1,2", backbone="Qwen3-4B-Base"),
    "paper": Scale("paper_qwen3_4b", "paper", "0,1,2", "0,1,2", backbone="Qwen3-4B-Base", gpus=True),
    # The paper's second backbone (Tables 1 and 2, lower half): conf/experiment/paper_mimo_7b.yaml.
    "paper_mimo_7b": Scale("paper_mimo_7b", "paper", "0,1,2", "0,1,2", backbone="MiMo-7B-Base", gpus=True),
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
def socratic_zero_run(endpoint: Optional[str], model: Optional[str]) -> Optional[tuple[str, ...]]:
    """The Socratic-Zero multirun of Table 1 with its Teacher, an external model: None when none is configured."""
    if not endpoint and not model:
        return None
    if not endpoint or not model:
        raise SystemExit("[sweep] Socratic-Zero needs both --teacher-endpoint and --teacher-model")
    return ("ablation=table1", "method=socratic_zero", "seed=0", f"method.extra.teacher_endpoint={endpoint}",
            f"method.extra.teacher_model={model}")


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
    made = []
    for method in sweep.eval_only_methods:
        d = out / f"method={method}"
        if not (d / rundir.CONFIG).exists():
            cfg = compose([f"ablation={sweep.name}", f"experiment={scale.experiment}", f"method={method}", *extra])
            d.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(cfg, d / rundir.CONFIG, resolve=True)
        made.append(d)
    return made


# --------------------------------------------------------------------------------------------------
# The GPU scales: member by member, each over a node's GPUs

SLURM_NODE = LAUNCHER_CONF / "slurm_node.yaml"
# What several ranks cannot run (unifiedplayers.checks.check_ranks), and the member's way round it: the stale
# control copies the module, which ZeRO-3 partitions; ZeRO-2 (the same update, tests/distributed) can.
RANK_FALLBACKS = {("deepspeed_zero3", "stale"): "trainer.backend=deepspeed_zero2"}


@dataclass(frozen=True)
class Member:
    """One training run of a sweep at a GPU scale: its Hydra job's overrides, its directory
    (``<sweep dir>/<hydra.job.override_dirname>``) and its ``ranks``, on ``nodes`` nodes of ``ranks // nodes``."""
    overrides: tuple[str, ...]
    run_dir: Path
    ranks: int
    finished: bool = False  # its run is complete: nothing to launch
    nodes: int = 1

    def train_args(self) -> list[str]:
        """Its training overrides, ``run_dir`` quoted for Hydra's parser (the name holds ``=`` and ``,``)."""
        if "'" in str(self.run_dir):
            raise ValueError(f"{self.run_dir}: a sweep directory with a quote (') cannot be passed to Hydra")
        return [*self.overrides, f"run_dir='{self.run_dir}'"]

    def command(self, rendezvous: Optional[dict[str, str]] = None) -> list[str]:
        """One node's command: this interpreter's torchrun over the node's ranks (:mod:`unifiedplayers.launch`;
        ``rendezvous`` on several nodes: :func:`slurm_rendezvous`), or one plain process for one rank."""
        from unifiedplayers.launch import torchrun_command

        train = ["-m", "unifiedplayers.train", *self.train_args()]
        if self.ranks == 1:
            return [sys.executable, *train]
        env = {**(rendezvous or {}), "NNODES": str(self.nodes)}
        return [*torchrun_command(sys.executable, self.ranks // self.nodes, env), *train]


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """The jobs of one ``python -m unifiedplayers.train -m <overrides>``, made by Hydra's basic sweeper itself (the
    ablation preset's ``hydra.sweeper.params`` first, so the command line's win)."""
    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("ablation=")), None)
    params = OmegaConf.select(OmegaConf.load(CONF_DIR / "ablation" / f"{preset}.yaml"), "hydra.sweeper.params",
                              default={}) if preset else {}
    parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *overrides])
    return BasicSweeper.split_arguments(parsed, None)[0]


def compose_job(overrides: Sequence[str]) -> tuple[Any, str]:
    """The config of one job (the run's config, validated) and its ``hydra.job.override_dirname``."""
    register_configs()
    check_override_keys(overrides)
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra.compose("config", overrides=list(overrides), return_hydra_config=True)
    dirname = str(cfg.hydra.job.override_dirname)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, dirname


def members(multiruns: Sequence[Sequence[str]], scale: Scale, out: Path, nproc: int,
            extra: Sequence[str] = (), nodes: int = 1) -> list[Member]:
    """Every member of ``multiruns`` at ``scale``, in Hydra's order, over ``nodes`` nodes of ``nproc`` ranks, or over
    the ranks its run began with (a run resumes only with its rank count). Fails before anything is launched on a
    member that its ranks cannot run (:data:`RANK_FALLBACKS` aside) or whose run does not match its config."""
    from unifiedplayers.checks import check_ranks
    from unifiedplayers.distributed import DistContext
    from unifiedplayers.loop.run_state import check_resumable

    found = []
    for run in multiruns:
        for job in expand([*run, f"experiment={scale.experiment}", "resume=true", *extra]):
            cfg, dirname = compose_job(job)
            run_dir = out / dirname
            state = rundir.load_state(run_dir / rundir.STATE) if (run_dir / rundir.STATE).exists() else None
            ranks = int(state.get("world_size", 1)) if state else nproc * nodes
            fallback = RANK_FALLBACKS.get((cfg.trainer.backend, cfg.schedule.feedback)) if ranks > 1 else None
            if fallback:
                job = [*job, fallback]
                cfg, _ = compose_job(job)
            if state:
                check_resumable(state, cfg, run_dir, ranks)
            check_ranks(cfg, DistContext(world_size=ranks))
            found.append(Member(tuple(job), run_dir, ranks, bool(state and state["finished"]),
                                nodes if ranks % nodes == 0 else 1))
    return found


def describe(member: Member, nproc: int) -> str:
    """Why a member's launch differs from the others', if it does."""
    notes = [f"resumes its run of {member.ranks} rank(s)"] if member.ranks != nproc else []
    notes += [f"{o} (not runnable as configured over {member.ranks} ranks: checks.check_ranks)"
              for o in member.overrides if o in RANK_FALLBACKS.values()]
    return "; ".join(notes)


def run_members_here(found: Sequence[Member], nproc: int, dry_run: bool, retries: int) -> None:
    """The local launcher at a GPU scale: one member at a time over this node's GPUs."""
    print(f"[sweep] {len(found)} members, one at a time over {nproc} GPU(s) each (torchrun)", flush=True)
    for m in found:
        if m.finished:
            print(f"[sweep] finished, not launched: {m.run_dir}", flush=True)
            continue
        if describe(m, nproc):
            print(f"[sweep] {m.run_dir.name}: {describe(m, nproc)}", flush=True)
        run(m.command(), dry_run, retries)


def slurm_rendezvous(env: Mapping[str, str]) -> dict[str, str]:
    """This node's place in a member's Slurm job of several nodes, as :mod:`unifiedplayers.launch` reads it; the port
    comes from the job's id, so that two jobs sharing a node do not meet on one port."""
    hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, check=True).stdout.split()
    return {"NODE_RANK": env["SLURM_NODEID"], "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(20000 + int(env["SLURM_JOB_ID"]) % 20000), "SLURM_JOB_ID": env["SLURM_JOB_ID"]}


class MemberJob:
    """What a member's Slurm job runs on each of its nodes (one task a node, pickled by submitit)."""

    def __init__(self, member: Member):
        self.member = member

    def command(self, env: Mapping[str, str] = os.environ) -> list[str]:
        return self.member.command(slurm_rendezvous(env) if self.member.nodes > 1 else None)

    def __call__(self) -> None:
        subprocess.run(self.command(), cwd=REPO, env={**os.environ, "HYDRA_FULL_ERROR": "1"}, check=True)


def slurm_settings(changes: Sequence[str] = ()) -> dict:
    """``ablations/conf/slurm_node.yaml`` with the ``--slurm KEY=VALUE`` changes."""
    if any(c.split("=", 1)[0] == "gpus_per_node" for c in changes):
        raise SystemExit("[sweep] --slurm gpus_per_node: a node's GPUs are its ranks, --nproc-per-node")
    merged = OmegaConf.merge(OmegaConf.load(SLURM_NODE), OmegaConf.from_dotlist(list(changes)))
    return OmegaConf.to_container(merged, resolve=True)


def run_members_on_slurm(found: Sequence[Member], sweep_name: str, out: Path, changes: Sequence[str],
                         dry_run: bool, executor: Any = None) -> None:
    """The slurm launcher at a GPU scale: each unfinished member one job, all submitted, then waited for.
    ``executor``: submitit's SlurmExecutor (tests pass a stand-in)."""
    settings = slurm_settings(changes)
    pending = [m for m in found if not m.finished]
    for m in found:
        if m.finished:
            print(f"[sweep] finished, not submitted: {m.run_dir}", flush=True)
    if not pending:
        return
    if executor is None and not dry_run:
        try:
            from submitit import SlurmExecutor as executor
        except ImportError:
            raise SystemExit("[sweep] --launcher slurm needs submitit: pip install -e '.[slurm]'") from None
    jobs = []
    for m in pending:
        params = {**{k: v for k, v in settings.items() if v is not None}, "nodes": m.nodes,  # and a GPU per rank
                  "gpus_per_node": m.ranks // m.nodes, "job_name": f"{sweep_name}-{m.run_dir.name}"[:120]}
        node0 = {"NODE_RANK": "0", "MASTER_ADDR": "<first host>", "MASTER_PORT": "<20000 + job id % 20000>"}
        print(f"[sweep] slurm job ({', '.join(f'{k}={v}' for k, v in params.items())}): "
              + ("" if m.nodes == 1 else "on each node, node 0's command (the others' NODE_RANK is their "
                 "SLURM_NODEID): ") + " ".join(shlex.quote(c) for c in m.command(node0 if m.nodes > 1 else None)),
              flush=True)
        if dry_run:
            continue
        ex = executor(folder=str(out / ".submitit" / "%j"))
        ex.update_parameters(**params)
        jobs.append((m, ex.submit(MemberJob(m))))
        print(f"[sweep] submitted {jobs[-1][1].job_id}: {m.run_dir}", flush=True)
    failed = []
    for m, job in jobs:
        try:
            job.results()  # every node's task
        except Exception as err:  # noqa: BLE001 - a failed or timed-out member: reported with the others
            last = (str(err).strip().splitlines() or [repr(err)])[-1]
            failed.append(f"{m.run_dir} (job {job.job_id}: {last})")
    if failed:
        raise SystemExit("[sweep] members failed; run the target again to resume them from their last save:\n  "
                         + "\n  ".join(failed))


def run(cmd: list[str], dry_run: bool, retries: int = 0) -> None:
    """Run one step; a failed training multirun is rerun up to ``retries`` times (its members resume: one member
    killed by the OOM killer aborts the whole joblib pool)."""
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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Train, evaluate and aggregate one of the paper's sweeps")
    ap.add_argument("sweep", choices=sorted(SWEEPS))
    ap.add_argument("--scale", choices=sorted(SCALES), default="smoke")
    ap.add_argument("--launcher", choices=["local", "slurm", "basic"], default="local")
    ap.add_argument("--jobs", type=int, default=2, help="local launcher at a CPU scale: members trained at a time "
                    "(at a GPU scale one member at a time over --nproc-per-node GPUs); runs evaluated at a time")
    ap.add_argument("--nproc-per-node", type=int, default=8,
                    help="GPU scales: the ranks (GPUs) of a member on each of its nodes: torchrun --nproc_per_node")
    ap.add_argument("--seeds", default=None, help="comma list of paired seeds instead of the scale's (e.g. 0,1)")
    ap.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                    help="GPU scales, --launcher slurm: change a key of ablations/conf/slurm_node.yaml (partition=gpu)")
    ap.add_argument("--list-members", action="store_true",
                    help="print each unfinished member (its run dir, then its training overrides; shell words), stop")
    ap.add_argument("--eval-threads", type=int, default=1, help="torch threads per evaluation process")
    ap.add_argument("--steps", default="train,evaluate,aggregate", help="comma list of steps to run")
    ap.add_argument("--root", default=str(REPO / "runs" / "ablations"), help="sweeps go to ROOT/<experiment>/<sweep>")
    ap.add_argument("--retries", type=int, default=1, help="reruns of a failed training multirun (members resume)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--teacher-endpoint", default=None,
                    help="table1: an OpenAI-compatible endpoint for Socratic-Zero's Teacher (e.g. http://host:8000/v1)")
    ap.add_argument("--teacher-model", default=None, help="table1: the Teacher's model name at that endpoint")
    ap.add_argument("overrides", nargs="*", help="extra training overrides for every member")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_intermixed_args(argv)
    sweep, scale = SWEEPS[args.sweep], SCALES[args.scale]
    nodes = int(slurm_settings(args.slurm)["nodes"]) if scale.gpus and args.launcher == "slurm" else 1
    if args.seeds:
        scale = replace(scale, seeds=args.seeds, stale_seeds=args.seeds)
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
    if args.list_members:
        for m in members(multiruns, scale, out, args.nproc_per_node, args.overrides, nodes):
            if not m.finished:
                print(shlex.join([str(m.run_dir), *m.train_args()]))
        return 0
    if "train" in steps and scale.gpus:
        found = members(multiruns, scale, out, args.nproc_per_node, args.overrides, nodes)
        if args.launcher == "slurm":
            run_members_on_slurm(found, sweep.name, out, args.slurm, args.dry_run)
        else:
            run_members_here(found, args.nproc_per_node, args.dry_run, args.retries)
    elif "train" in steps:
        for mr in multiruns:
            run(train_command(mr, scale, out, args.launcher, args.jobs, args.overrides), args.dry_run, args.retries)
    if "train" in steps and sweep.eval_only_methods and not args.dry_run:
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
