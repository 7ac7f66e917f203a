"""``make reproduce-figure1-ablation``: Figure 1 with and without the perturbation engine, on the same probes.

    python -m eval.probes.figure1_ablation --scale smoke --seeds 1 --root runs/figure1_ablation/smoke [--jobs 2]

Trains the Figure-1 preset twice per paired seed, as two arms (:data:`ARMS`): ``full`` and ``no_perturbation``
(Table 5's "w/o Perturbation Engine": P = 0, so ρ_adv = V(q) = 0 in training). Each arm is a root of
:mod:`eval.probes.figure1` of its own, ``<root>/<arm>/seed<s>``, not shared with ``make reproduce-figure1`` (a
finished run is skipped without its config being compared). Writes ``figure1_ablation.json`` and ``.png``
(:data:`PANELS`); eval/README.md says more.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from eval.probes import figure1 as F  # noqa: E402

# arm -> its training overrides on top of the preset's (Table 5's member, ablations/sweeps.py)
ARMS: dict[str, tuple[str, ...]] = {"full": (), "no_perturbation": ("perturbation=none",)}
# The panels of figure1_ablation.png: (title, series, scale)
PANELS = (
    ("Evaluation: adversarial rejection (%)", "evaluation/adv_rejection", 100.0),
    ("Evaluation: originals accepted (%)", "evaluation/originals_accepted", 100.0),
    ("Evaluation: discrimination (%)", "evaluation/discrimination", 100.0),
    ("Execution: tool-probe accuracy (%)", "execution/accuracy_tool", 100.0),
)
ARM_STYLE = {"full": ("o-", "C0"), "no_perturbation": ("s--", "C3")}


def arm_jobs(root: Path, experiment: str, seeds: Sequence[int], overrides: Sequence[str],
             probe_args: Sequence[str], iterations: int) -> list[F.Job]:
    """Every arm's jobs: all trainings first, then the probes in :func:`~eval.probes.figure1.probe_rank`'s order,
    both arms side by side; the backbone probes of the first arm only (copied into the other runs afterwards)."""
    trains, probes = [], []
    for index, (arm, extra) in enumerate(ARMS.items()):
        for job in F.build_jobs(root / arm, experiment, seeds, [*overrides, *extra], probe_args, iterations):
            job.name = f"{arm}: {job.name}"
            if job.iteration < 0:
                trains.append(job)
            elif job.iteration > 0 or index == 0:
                probes.append(job)
    probes.sort(key=lambda j: F.probe_rank(j.iteration, iterations))  # stable: per iteration, the first arm first
    return trains + probes


def summarise(fig: dict[str, Any]) -> dict[str, Any]:
    """An arm's entry of figure1_ablation.json: collect()'s figure1.json without the paper's endpoints."""
    return {k: v for k, v in fig.items() if k not in ("iterations", "seeds", "paper_qwen3_4b")}


def paired_differences(data: dict[str, Any], treated: str = "full", control: str = "no_perturbation"
                       ) -> dict[str, dict[str, Any]]:
    """Per series, the paired difference treated − control at the last iteration, seed by seed (in points; U in
    its own units; None where either is missing), with its mean and SD over the seeds."""
    out: dict[str, dict[str, Any]] = {}
    seeds = [str(s) for s in data["seeds"]]
    for key in F.SERIES:
        scale = 1.0 if key == "planning/U" else 100.0
        diffs: list[Optional[float]] = []
        for s in seeds:
            a = data["arms"][treated]["per_seed"][s][key][-1]
            b = data["arms"][control]["per_seed"][s][key][-1]
            diffs.append(None if a is None or b is None else (a - b) * scale)
        mean, sd = F.mean_sd(diffs)
        out[key] = {"per_seed": diffs, "mean": mean, "sd": sd}
    return out


def rule_margins(arm_root: Path, seeds: Sequence[int], iterations: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per perturbation rule, each checkpoint's rejection of that rule's variants minus its rejection of the
    originals by the same valid verifiers: what they detect beyond rejecting everything (an errored original check
    counts as a rejection and an errored variant check as none, so a margin is low by up to ``check_errors``).
    ``{rule: {"per_seed": {seed: [per iteration]}, "mean": [per iteration]}}``; None where a probe is missing."""
    per_seed: dict[str, dict[str, list[Optional[float]]]] = {}
    for s in seeds:
        for idx, i in enumerate(iterations):
            path = F.probe_file(arm_root / f"seed{s}", i, "evaluation")
            ev = json.loads(path.read_text()).get("evaluation", {}) if path.exists() else {}
            accepted = ev.get("original_acceptance")
            for rule, rejected in (ev.get("per_rule_rejection") or {}).items():
                row = per_seed.setdefault(rule, {}).setdefault(str(s), [None] * len(iterations))
                if rejected is not None and accepted is not None:
                    row[idx] = rejected - (1.0 - accepted)
    out = {}
    for rule, rows in per_seed.items():
        for s in seeds:
            rows.setdefault(str(s), [None] * len(iterations))
        out[rule] = {"per_seed": rows,
                     "mean": [F.mean_sd([rows[str(s)][idx] for s in seeds])[0] for idx in range(len(iterations))]}
    return out


def reproduce_ablation(root: Path, experiment: str, seeds: Sequence[int], jobs: int = 2,
                       overrides: Sequence[str] = (), probe_args: Sequence[str] = (),
                       log: Any = print, collect_only: bool = False) -> tuple[Path, bool]:
    """Train and probe both arms, write figure1_ablation.json/png; returns (path of the json, everything done).
    ``collect_only``: write them from what is done so far, starting nothing (missing probes are None)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    iterations = F.outer_iterations(experiment, overrides)
    job_list = arm_jobs(root, experiment, seeds, overrides, probe_args, iterations)
    F.run_jobs(job_list, jobs, F.job_env(), log, start=not collect_only)
    arms = list(ARMS)
    first = root / arms[0] / f"seed{seeds[0]}"
    F.copy_backbone_probes(first, [root / a / f"seed{s}" for a in arms for s in seeds
                                   if (root / a / f"seed{s}") != first])
    its = list(range(iterations + 1))
    out: dict[str, Any] = {"iterations": its, "seeds": list(seeds), "arms": {}}
    for arm in arms:
        fig = F.collect(root / arm, seeds, its)
        fig["overrides"] = [*overrides, *ARMS[arm]]
        fig["change_first_to_last"] = F.rises(fig)
        (root / arm).mkdir(parents=True, exist_ok=True)  # --collect-only before an arm has begun
        (root / arm / "figure1.json").write_text(json.dumps(fig, indent=1))
        out["arms"][arm] = summarise(fig)
        out["arms"][arm]["rule_margin"] = rule_margins(root / arm, seeds, its)
    out["experiment"], out["overrides"] = experiment, list(overrides)
    out["arm_overrides"] = {a: list(o) for a, o in ARMS.items()}
    out["full_minus_no_perturbation_last"] = paired_differences(out)
    out["wall_s"] = time.time() - t0
    out["jobs"] = F.jobs_summary(job_list)
    path = root / "figure1_ablation.json"
    path.write_text(json.dumps(out, indent=1))
    plot_ablation(out, root / "figure1_ablation.png",
                  f"Figure 1 with and without the perturbation engine ({experiment}, seeds {list(seeds)})")
    ok = all(j.rc == 0 for j in job_list)
    for _, key, scale in PANELS:
        for arm in arms:
            values = out["arms"][arm]["series"][key]
            log(f"[figure1-ablation] {arm} {key}: "
                + " -> ".join("-" if v is None else f"{v * scale:.1f}" for v in values))
    for arm in arms:
        for rule, d in out["arms"][arm]["rule_margin"].items():
            log(f"[figure1-ablation] {arm} rule margin (variants' minus originals' rejection) {rule}: "
                + " -> ".join("-" if v is None else f"{v * 100:+.1f}" for v in d["mean"]))
    for key, d in out["full_minus_no_perturbation_last"].items():
        if d["mean"] is not None:
            n = 2 if key == "planning/U" else 1  # U in its own units, the rates in points
            log(f"[figure1-ablation] full - no_perturbation at the last iteration, {key}: mean {d['mean']:+.{n}f}"
                + ("" if d["sd"] is None else f" (SD {d['sd']:.{n}f})") + " per seed "
                + " / ".join("-" if v is None else f"{v:+.{n}f}" for v in d["per_seed"]))
    log(f"[figure1-ablation] {'done' if ok else F.incomplete(collect_only)} in "
        f"{out['wall_s'] / 60:.1f} min; {root / 'figure1_ablation.png'}")
    return path, ok


def plot_ablation(data: dict[str, Any], path: Path, title: str = "") -> Path:
    """Four panels (:data:`PANELS`), both arms in each (:func:`~eval.probes.figure1.draw_series`)."""
    plt = F.pyplot()
    its = data["iterations"]
    seeds = [str(s) for s in data["seeds"]]
    figure, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 4.2))
    for ax, (name, key, scale) in zip(axes, PANELS):
        for arm, fig in data["arms"].items():
            style, color = ARM_STYLE.get(arm, ("^:", None))
            F.draw_series(ax, fig, key, scale, its, seeds, arm, style, color)
        ax.set_title(f"{name}\n{key}", fontsize=9)
        ax.set_ylim(0, 105)
        ax.set_xlabel("outer iteration (0 = backbone)")
        ax.set_xticks(its)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=7)
    return F.save_figure(plt, figure, path, title or f"Figure 1 ablation: seeds {data['seeds']}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    def check(ap: Any, args: Any) -> None:
        bad = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") == "perturbation"]
        if bad:
            ap.error(f"{bad}: the arms set the perturbation engine themselves ({ARMS})")

    args, experiment, root = F.parse_args("figure1_ablation", __doc__.split("\n")[0], argv, check)
    path, ok = reproduce_ablation(root, experiment, list(range(args.seeds)), args.jobs, args.overrides,
                                  args.probe_args.split(), collect_only=args.collect_only)
    print(path)
    return 0 if ok or args.collect_only else 1


if __name__ == "__main__":
    sys.exit(main())
