"""``make reproduce-figure1``: the paper's Figure 1a (§4.5) at laptop scale, from the held-out probes.

    python -m eval.probes.figure1 --scale smoke --seeds 1 --root runs/figure1/smoke [--jobs 2] [overrides]

Per paired seed: one training run (``<root>/seed<s>``), then ``python -m eval.probes`` on the backbone (iteration 0)
and on each ``checkpoints/iter<i>/<role>``, one job per checkpoint and role, overlapping training and resumable
(:func:`probe_done`). Writes ``figure1.json`` (:data:`SERIES`) and ``figure1.png`` into ``--root``; eval/README.md
says more.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from unifiedplayers import rundir  # noqa: E402

SCALES = {"smoke": "figure1_smoke", "paper": "paper_qwen3_4b"}
SERIES = ("planning/U", "planning/well_formed", "execution/accuracy", "execution/answered",
          "execution/accuracy_tool", "evaluation/valid", "evaluation/originals_accepted",
          "evaluation/adv_rejection", "evaluation/discrimination")
DONE_KEYS = {"execution": "execution/accuracy_tool", "evaluation": "evaluation/originals_accepted"}
POLL_S = 2.0
PROBE_ROLES = ("execution", "evaluation", "planning")  # the order their jobs start in (longest first)


# Jobs


@dataclass
class Job:
    name: str
    argv: list[str]
    log: Path
    ready: Any  # () -> bool
    done: Any  # () -> bool (already done: skipped)
    seed: int
    iteration: int = -1  # probes: the checkpoint's outer iteration; -1 for a training job
    proc: Optional[subprocess.Popen] = None
    rc: Optional[int] = None
    seconds: float = 0.0
    started: float = 0.0


def _metrics_iteration(run_dir: Path) -> int:
    """The highest outer iteration with a logged update (its line is written before its checkpoint; a line of
    iteration i + 1 therefore means iteration i's checkpoints are complete)."""
    with warnings.catch_warnings():  # the run may be writing its last line now: it is skipped
        warnings.simplefilter("ignore", RuntimeWarning)
        return max((int(m.get("outer_iteration", 0)) for m in rundir.read_jsonl(run_dir / rundir.METRICS,
                                                                               missing_ok=True)), default=0)


def run_jobs(jobs: list[Job], max_jobs: int, env: dict[str, str], log: Any = print, start: bool = True) -> None:
    """Start jobs (in list order, when ready) with at most ``max_jobs`` running; wait for all of them. A job that
    never becomes ready (its run failed), or any job not done when ``start`` is False, is left with ``rc`` None."""
    pending = [j for j in jobs if not j.done()]
    for j in jobs:
        if j not in pending:
            j.rc = 0
            log(f"[figure1] {j.name}: already done")
    if not start:
        for j in pending:
            log(f"[figure1] {j.name}: not run (--collect-only)")
        return
    running: list[Job] = []
    while pending or running:
        for j in list(running):
            rc = j.proc.poll()
            if rc is not None:
                j.rc, j.seconds = rc, time.time() - j.started
                running.remove(j)
                log(f"[figure1] {j.name}: {'done' if rc == 0 else f'FAILED (exit {rc}; log {j.log})'} "
                    f"in {j.seconds:.0f} s")
        for j in list(pending):
            if len(running) >= max_jobs:
                break
            if j.ready():
                pending.remove(j)
                j.log.parent.mkdir(parents=True, exist_ok=True)
                j.started = time.time()
                j.proc = subprocess.Popen(j.argv, stdout=open(j.log, "w"), stderr=subprocess.STDOUT, env=env,
                                          cwd=str(_ROOT))
                running.append(j)
                log(f"[figure1] {j.name}: started ({' '.join(j.argv[1:])})")
        if pending and not running and not any(j.ready() for j in pending):
            for j in pending:
                log(f"[figure1] {j.name}: not run (its run failed or stopped before it)")
            return
        time.sleep(POLL_S)


# figure1.json


def probe_file(run_dir: Path, iteration: int, role: Optional[str] = None) -> Path:
    """``probes/iter<i>.json`` (all roles in one file) or ``probes/iter<i>.<role>.json`` (one role's probe)."""
    return run_dir / rundir.PROBES / (f"iter{iteration}.json" if role is None else f"iter{iteration}.{role}.json")


def read_probes(run_dir: Path, iteration: int) -> Optional[dict[str, Any]]:
    """The probes of one checkpoint, merged from its whole-checkpoint file and its per-role files; None if none."""
    from eval.probes.probes import ROLES

    merged: dict[str, Any] = {"metrics": {}, "sources": {}}
    found = False
    for path in [probe_file(run_dir, iteration)] + [probe_file(run_dir, iteration, r) for r in ROLES]:
        if path.exists():
            data = json.loads(path.read_text())
            merged["metrics"].update(data.get("metrics", {}))
            merged["sources"].update(data.get("sources", {}))
            found = True
    return merged if found else None


def probe_done(path: Path, role: str) -> bool:
    """Whether a probe file is finished: it exists and holds its role's :data:`DONE_KEYS` key."""
    if not path.exists():
        return False
    if role not in DONE_KEYS:
        return True
    try:
        return DONE_KEYS[role] in json.loads(path.read_text()).get("metrics", {})
    except (ValueError, OSError):
        return False


def mean_sd(values: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float]]:
    """Mean and sample SD (n − 1) of the values that are not None; None where there are too few."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    return m, ((sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None)


def collect(root: Path, seeds: Sequence[int], iterations: Sequence[int]) -> dict[str, Any]:
    """figure1.json from the probe files: per series the mean over the seeds that have a value."""
    per_seed: dict[str, dict[str, list[Optional[float]]]] = {}
    probe_se: dict[str, dict[str, list[Optional[float]]]] = {}
    sources: dict[str, list[Optional[dict]]] = {}
    for s in seeds:
        run_dir = root / f"seed{s}"
        rows = [read_probes(run_dir, i) for i in iterations]
        metrics = [r["metrics"] if r else {} for r in rows]
        per_seed[str(s)] = {k: [m.get(k) for m in metrics] for k in SERIES}
        probe_se[str(s)] = {k: [m.get(f"{k}_se") for m in metrics] for k in SERIES}
        sources[str(s)] = [r["sources"] if r else None for r in rows]
    series, spread = {}, {}
    for k in SERIES:
        stats = [mean_sd([per_seed[str(s)][k][idx] for s in seeds]) for idx in range(len(iterations))]
        series[k], spread[k] = [m for m, _ in stats], [sd for _, sd in stats]
    from eval.paper_numbers import FIGURE1_ENDPOINTS

    return {
        "iterations": list(iterations), "seeds": list(seeds), "series": series, "per_seed": per_seed,
        "sd_over_seeds": spread, "probe_se": probe_se, "sources": sources,
        # §4.5, Qwen3-4B-Base, iteration 1 -> iteration 3 (eval/paper_numbers.py)
        "paper_qwen3_4b": {"iterations": [1, 3], "planning/U": list(FIGURE1_ENDPOINTS["mean_U"]),
                           "execution/accuracy": list(FIGURE1_ENDPOINTS["execution_accuracy"]),
                           "evaluation/adv_rejection": list(FIGURE1_ENDPOINTS["adversarial_rejection"])},
    }


def rises(fig: dict[str, Any]) -> dict[str, Optional[float]]:
    """Change of each series from the first to the last iteration, in points (U in its own units)."""
    out = {}
    for k, v in fig["series"].items():
        if v and v[0] is not None and v[-1] is not None:
            out[k] = (v[-1] - v[0]) * (1.0 if k == "planning/U" else 100.0)
        else:
            out[k] = None
    return out


# figure1.png


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_series(ax: Any, fig: dict[str, Any], key: str, scale: float, its: Sequence[int], seeds: Sequence[str],
                label: str, style: str, color: Optional[str] = None) -> None:
    """One series of ``fig`` (figure1.json's layout): the mean over seeds with bars (the probe's SE for one seed,
    the SD over seeds for several), and a thin line per seed when there are several."""
    bars = fig["sd_over_seeds"][key] if len(seeds) > 1 else fig["probe_se"][seeds[0]][key] if seeds else []
    bars = list(bars) or [None] * len(its)
    pts = [(x, y * scale, (e or 0.0) * scale) for x, y, e in zip(its, fig["series"][key], bars) if y is not None]
    if pts:
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt=style, capsize=3,
                    label=label, color=color)
    if len(seeds) > 1:
        for s in seeds:
            sp = [(x, y * scale) for x, y in zip(its, fig["per_seed"][s][key]) if y is not None]
            ax.plot([p[0] for p in sp], [p[1] for p in sp], "-", lw=0.6, alpha=0.35, color=color)


def save_figure(plt: Any, figure: Any, path: Path, title: str) -> Path:
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot(fig: dict[str, Any], path: Path, title: str = "") -> Path:
    """Three panels as the paper's Figure 1a (:func:`draw_series`), the paper's Qwen3-4B-Base endpoints dashed."""
    plt = pyplot()
    its = fig["iterations"]
    paper = fig["paper_qwen3_4b"]
    seeds = [str(s) for s in fig["seeds"]]
    panels = [
        ("Planning: uncertainty U(q)", "planning/U", 1.0, [("planning/well_formed", "well-formed tasks (right axis, %)")]),
        ("Execution: accuracy (%)", "execution/accuracy", 100.0,
         [("execution/answered", "answered"), ("execution/accuracy_tool", "tool probe: execution/accuracy_tool")]),
        ("Evaluation: adversarial rejection (%)", "evaluation/adv_rejection", 100.0,
         [("evaluation/valid", "valid verifiers"), ("evaluation/discrimination", "discrimination (§4.5)"),
          ("evaluation/originals_accepted", "evaluation/originals_accepted")]),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))

    def draw(ax: Any, key: str, scale: float, label: str, style: str, color: Optional[str] = None) -> None:
        draw_series(ax, fig, key, scale, its, seeds, label, style, color)

    for ax, (name, key, scale, extra) in zip(axes, panels):
        draw(ax, key, scale, "ours (held-out probes)", "o-", "C0")
        if key in paper:
            ax.plot(paper["iterations"], [v * scale for v in paper[key]], "s--", color="C3",
                    label="paper: Qwen3-4B-Base (§4.5 endpoints)")
        if key == "planning/U":
            twin = ax.twinx()
            draw(twin, extra[0][0], 100.0, extra[0][1], "^:", "C2")
            twin.set_ylim(0, 105)
            if twin.get_legend_handles_labels()[0]:
                twin.legend(loc="lower right", fontsize=7)
            ax.set_ylim(0, 0.52)  # U = min(p, 1 - p) <= 0.5
        else:
            for (k, lab), c in zip(extra, ("C2", "C1", "C4")):
                draw(ax, k, scale, lab, "^:", c)
            ax.set_ylim(0, 105)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("outer iteration (0 = backbone)")
        ax.set_xticks(its)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left" if key != "planning/U" else "center left", fontsize=7)
    return save_figure(plt, figure, path, title or f"Figure 1a reproduction: seeds {fig['seeds']}")


# The whole target


def outer_iterations(experiment: str, overrides: Sequence[str]) -> int:
    from unifiedplayers.config import compose

    return int(compose([f"experiment={experiment}", *overrides]).schedule.outer_iterations)


def build_jobs(root: Path, experiment: str, seeds: Sequence[int], overrides: Sequence[str], probe_args: Sequence[str],
               iterations: int) -> list[Job]:
    py = sys.executable
    trains, probes = [], []
    for s in seeds:
        run_dir = root / f"seed{s}"
        train = Job(f"train seed {s}", [py, "-m", "unifiedplayers.train", f"experiment={experiment}", f"seed={s}",
                                        f"run_dir={run_dir}", "resume=true", *overrides],
                    root / "logs" / f"train-seed{s}.log", ready=lambda: True,
                    done=lambda rd=run_dir: (rd / rundir.SUMMARY_JSON).exists() and _finished_state(rd), seed=s)
        trains.append(train)
        for i in range(iterations + 1):
            if i == 0 and s != seeds[0]:
                continue  # the backbone is probed once, for the first seed (share_backbone_probes)
            target = "backbone" if i == 0 else str(run_dir / rundir.CHECKPOINTS / f"iter{i}")

            def ready(i=i, rd=run_dir, tr=train) -> bool:
                if tr.rc not in (None, 0):
                    return False  # the run failed: nothing more of it can be probed
                if i == 0:
                    return (rd / rundir.CONFIG).exists()
                return tr.rc == 0 or _metrics_iteration(rd) > i

            for role in PROBE_ROLES:  # one job per role: the last checkpoint's probes share the cores
                probes.append(Job(f"probe seed {s} iteration {i} {role}",
                                  [py, "-m", "eval.probes", target, "--run", str(run_dir), "--roles", role,
                                   "--out", str(probe_file(run_dir, i, role)), *probe_args],
                                  root / "logs" / f"probe-seed{s}-iter{i}-{role}.log", ready=ready,
                                  done=lambda p=probe_file(run_dir, i, role), r=role: probe_done(p, r), seed=s,
                                  iteration=i))
    probes.sort(key=lambda j: (probe_rank(j.iteration, iterations), j.seed))  # stable: execution first per checkpoint
    return trains + probes


def probe_rank(iteration: int, iterations: int) -> tuple[int, int]:
    """The order probes start in (among those ready): the endpoints first (the backbone and the last iteration,
    which the figure's changes are read at, so a target stopped part-way has them), then the middle iterations."""
    return (0 if iteration in (0, iterations) else 1, iteration)


def share_backbone_probes(root: Path, seeds: Sequence[int]) -> list[Path]:
    """Copy the first seed's iteration-0 (backbone) probe files into the other seeds' runs: the probes sample with
    their own fixed seed (``PROBE_SEED``) and the backbone is the same for every seed, so it is one measurement."""
    return copy_backbone_probes(root / f"seed{seeds[0]}", [root / f"seed{s}" for s in seeds[1:]])


def copy_backbone_probes(first: Path, runs: Sequence[Path]) -> list[Path]:
    """Copy the iteration-0 probe files of the run ``first`` into each of ``runs`` where absent, or where the
    copy there lacks the tool probe and the source has it. Returns the files written."""
    written = []
    for run_dir in runs:
        for src in sorted((first / rundir.PROBES).glob("iter0*.json")):
            dst = run_dir / rundir.PROBES / src.name
            stale = dst.exists() and src.name.endswith(".execution.json") and probe_done(src, "execution") \
                and not probe_done(dst, "execution")
            if not dst.exists() or stale:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                written.append(dst)
    return written


def _finished_state(run_dir: Path) -> bool:
    state = run_dir / rundir.STATE
    if not state.exists():
        return False
    import torch

    try:
        return bool(torch.load(state, weights_only=False).get("finished"))
    except Exception:  # a torn or foreign file: treat as not finished, training resumes or says why
        return False


def reproduce(root: Path, experiment: str, seeds: Sequence[int], jobs: int = 2, overrides: Sequence[str] = (),
              probe_args: Sequence[str] = (), log: Any = print, collect_only: bool = False) -> tuple[Path, bool]:
    """Train, probe, write figure1.json/png; returns (path of figure1.json, everything done). ``collect_only``:
    write them from what is done so far, starting nothing (missing probes are None)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    iterations = outer_iterations(experiment, overrides)
    job_list = build_jobs(root, experiment, seeds, overrides, probe_args, iterations)
    run_jobs(job_list, jobs, job_env(), log, start=not collect_only)
    share_backbone_probes(root, seeds)
    its = list(range(iterations + 1))
    fig = collect(root, seeds, its)
    fig["experiment"], fig["overrides"], fig["wall_s"] = experiment, list(overrides), time.time() - t0
    fig["jobs"] = jobs_summary(job_list)
    fig["change_first_to_last"] = rises(fig)
    from unifiedplayers.diagnostics.summary import write_summary_png

    for s in seeds:
        if (root / f"seed{s}" / rundir.METRICS).exists():
            write_summary_png(root / f"seed{s}")  # now with the probes beside the training curves
        single = collect(root, [s], its)
        (root / f"seed{s}").mkdir(parents=True, exist_ok=True)
        (root / f"seed{s}" / "figure1.json").write_text(json.dumps(single, indent=1))
    out = root / "figure1.json"
    out.write_text(json.dumps(fig, indent=1))
    plot(fig, root / "figure1.png", f"Figure 1a reproduction ({experiment}, seeds {list(seeds)})")
    ok = all(j.rc == 0 for j in job_list)
    for k, d in fig["change_first_to_last"].items():
        unit = "" if k == "planning/U" else " points"
        log(f"[figure1] {k}: " + " -> ".join("-" if v is None else f"{v:.3f}" for v in fig["series"][k])
            + ("" if d is None else f" (change {d:+.3f}{unit})"))
    log(f"[figure1] {'done' if ok else incomplete(collect_only)} in {fig['wall_s'] / 60:.1f} min; "
        f"{root / 'figure1.png'}")
    return out, ok


def job_env() -> dict[str, str]:
    """The jobs' environment: one torch thread each, this checkout importable."""
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def jobs_summary(job_list: Sequence[Job]) -> dict[str, Any]:
    return {j.name: {"rc": j.rc, "seconds": round(j.seconds, 1), "log": str(j.log)} for j in job_list}


def incomplete(collect_only: bool) -> str:
    """The closing line's word for a target that did not finish every job."""
    return "PARTIAL (--collect-only: jobs not run are listed above)" if collect_only else \
        "INCOMPLETE (see the failed jobs above)"


def parse_args(name: str, description: str, argv: Optional[Sequence[str]],
               check: Any = None) -> tuple[argparse.Namespace, str, Path]:
    """The command line of ``python -m eval.probes.<name>``: (args, experiment, root); ``check(ap, args)`` may
    refuse more."""
    ap = argparse.ArgumentParser(prog=f"python -m eval.probes.{name}", description=description)
    ap.add_argument("overrides", nargs="*", help="training overrides key=value")
    ap.add_argument("--scale", choices=sorted(SCALES), default="smoke")
    ap.add_argument("--experiment", help="a conf/experiment preset instead of the scale's")
    ap.add_argument("--seeds", type=int, default=1, help="paired seeds 0 .. N-1")
    ap.add_argument("--root", type=Path, help=f"default runs/{name}/<scale>")
    ap.add_argument("--jobs", type=int, default=2, help="processes at once (one torch thread each)")
    ap.add_argument("--probe-args", default="", help="extra arguments of python -m eval.probes (sizes)")
    ap.add_argument("--collect-only", action="store_true",
                    help="write the json and png from the runs and probes done so far; start nothing")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    if check is not None:
        check(ap, args)
    args.jobs = max(1, args.jobs)
    return args, args.experiment or SCALES[args.scale], args.root or Path("runs") / name / args.scale


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, experiment, root = parse_args("figure1", __doc__.split("\n")[0], argv)
    path, ok = reproduce(root, experiment, list(range(args.seeds)), args.jobs, args.overrides,
                         args.probe_args.split(), collect_only=args.collect_only)
    print(path)
    return 0 if ok or args.collect_only else 1


if __name__ == "__main__":
    sys.exit(main())
