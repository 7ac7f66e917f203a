"""Training curves per outer iteration (Figure 1a): mean U(q), Execution accuracy and the Evaluation adversarial
rejection, from the metrics or else the records (eval/README.md); writes ``curves.png`` and ``curves.json``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional, Sequence

import numpy as np

from eval.analysis.rundir import RunData, key, single_run_main
from eval.paper_numbers import FIGURE1_ENDPOINTS

PANELS = [("mean_U", "mean U(q)"), ("execution_accuracy", "Execution accuracy"),
          ("adversarial_rejection", "Evaluation adversarial rejection")]


def _by_iteration(run: RunData, metric_key: str, reduce: str) -> dict[int, float]:
    groups: dict[int, list[float]] = defaultdict(list)
    for row, v in run.series(metric_key):
        it = row.get(key("iteration"))
        if it is not None:
            groups[int(it)].append(v)
    if reduce == "last":
        return {it: vals[-1] for it, vals in groups.items()}
    return {it: float(np.mean(vals)) for it, vals in groups.items()}


def _from_records(run: RunData, what: str) -> dict[int, float]:
    from unifiedplayers.feedback.rewards import adversarial_rejection_rate, uncertainty

    groups: dict[int, list[float]] = defaultdict(list)
    for rec in run.played_records():
        if rec.iteration is None:
            continue
        if what == "mean_U":
            groups[int(rec.iteration)].append(uncertainty([t.final_answer for t in rec.trajectories]))
        elif what == "adversarial_rejection" and np.asarray(rec.z_adv).shape[0] > 0:
            groups[int(rec.iteration)].extend(adversarial_rejection_rate(rec.z_adv, rec.adv_mask, rec.error_adv).tolist())
    return {it: float(np.mean(v)) for it, v in groups.items() if v}


def curves(run: RunData) -> dict[str, Any]:
    out: dict[str, Any] = {"source": {}}
    for name, _ in PANELS:
        values = _by_iteration(run, key(name), "last" if name == "execution_accuracy" else "mean")
        source = f"metrics: {run.used_key(key(name))}"
        if not values and name != "execution_accuracy":
            values, source = _from_records(run, name), "records"
        out[name] = {str(k): v for k, v in sorted(values.items())}
        out["source"][name] = source if values else "missing"
    out["paper_endpoints"] = {k: list(v) for k, v in FIGURE1_ENDPOINTS.items()}
    return out


def plot(result: dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, (name, title) in zip(axes, PANELS):
        series = result[name]
        if series:
            xs = [int(k) for k in series]
            ax.plot(xs, list(series.values()), marker="o", label="this run")
            ax.set_xticks(xs)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        first, last = result["paper_endpoints"][name]
        ax.axhline(first, color="gray", ls=":", lw=1, label="paper iter 1")
        ax.axhline(last, color="gray", ls="--", lw=1, label="paper iter 3")
        src = result["source"][name]
        ax.set_title(title + (f"\n({src})" if src not in ("missing",) else ""), fontsize=9)
        ax.set_xlabel("outer iteration")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def to_markdown(result: dict[str, Any]) -> str:
    its = sorted({int(k) for name, _ in PANELS for k in result[name]})
    lines = ["**Training curves per outer iteration** (Figure 1a)", "",
             "| quantity | " + " | ".join(f"iter {i}" for i in its) + " | source |", "|" + "---|" * (len(its) + 2)]
    for name, title in PANELS:
        cells = [f"{result[name][str(i)]:.3f}" if str(i) in result[name] else "–" for i in its]
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {result['source'][name]} |")
    return "\n".join(lines) + "\n"


analyse = curves


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    def analyse_some(run: RunData) -> dict[str, Any]:
        if not run.metrics and not run.records:
            raise SystemExit(f"{run.path}: neither metrics.jsonl nor records.jsonl to plot")
        return analyse(run)

    return single_run_main(argv, "Figure 1 curves per outer iteration", "curves", analyse_some, to_markdown,
                           figure=plot)


if __name__ == "__main__":
    main()
