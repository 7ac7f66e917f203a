"""Optimisation diagnostics in the layout of Table 4 (Appendix D.2; Tables 7 and 8 for other players), one row per
run directory, the paper's rows below ours; the columns are defined in eval/README.md.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import numpy as np

from eval.analysis.rundir import RunData, key, load_run, write_outputs
from eval.paper_numbers import TABLE4


def negative_steps(accuracy: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    """:func:`unifiedplayers.diagnostics.execution_pool.negative_steps` with the largest fall in points."""
    from unifiedplayers.diagnostics.execution_pool import negative_steps as rate_and_drop

    scale = 100.0 if accuracy and max(accuracy) <= 1.0 else 1.0
    return rate_and_drop([scale * a for a in accuracy])


def diagnostics(run: RunData, player: str = "execution") -> dict[str, Any]:
    grad = [v for _, v in run.series(key("grad_norm", player))]
    kl = [v for _, v in run.series(key("kl", player))]
    clip = [v for _, v in run.series(key("clip_frac", player))]
    entropy = [v for _, v in run.series(key("entropy", player))]
    ratio_logged = [v for _, v in run.series(key("entropy_ratio", player))]
    accuracy = [v for _, v in run.series(key("accuracy", player))]
    if ratio_logged:
        entropy_ratio = ratio_logged[-1]
    elif len(entropy) >= 2 and entropy[0] > 0:
        entropy_ratio = entropy[-1] / entropy[0]
    else:
        entropy_ratio = None
    neg, drop = negative_steps(accuracy)
    g = np.asarray(grad, dtype=float)
    return {
        "label": run.label, "player": player, "num_updates": len(grad),
        "grad_norm_median": float(np.median(g)) if g.size else None,
        "grad_norm_cv": float(g.std() / g.mean()) if g.size and g.mean() > 0 else None,
        "kl": float(np.mean(kl)) if kl else None, "clip_frac": float(np.mean(clip)) if clip else None,
        "entropy_ratio": entropy_ratio, "negative_step_rate": neg, "max_drop": drop,
        "num_accuracy_checkpoints": len(accuracy),
    }


def _f(x: Optional[float], digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def to_markdown(rows: Sequence[dict[str, Any]], with_paper: bool = True) -> str:
    player = rows[0]["player"] if rows else "execution"
    lines = [f"**Optimisation diagnostics** ({player.capitalize()} player, Table 4 layout)", "",
             "| Configuration | Grad. Med./CV | KL | Clip | Entropy | Neg. Steps | Max Drop |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} (ours) | {_f(r['grad_norm_median'], 2)} / {_f(r['grad_norm_cv'], 2)} | "
                     f"{_f(r['kl'], 3)} | {_f(r['clip_frac'], 2)} | {_f(r['entropy_ratio'], 2)} | "
                     f"{_f(r['negative_step_rate'], 2)} | {_f(r['max_drop'], 1)} |")
    if with_paper and player == "execution":
        for name, (med, cv, kl, clip, ent, neg, drop) in TABLE4.items():
            lines.append(f"| {name} (paper, Qwen3-4B-Base) | {med:.2f} / {cv:.2f} | {kl:.3f} | {clip:.2f} | "
                         f"{ent:.2f} | {neg:.2f} | {drop:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description="Table 4 optimisation diagnostics from run directories")
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--player", default="execution", choices=["planning", "execution", "evaluation"])
    args = ap.parse_args(argv)
    runs = [load_run(d, need_metrics=True) for d in args.run_dirs]
    rows = [diagnostics(r, args.player) for r in runs]
    md = to_markdown(rows)
    out = write_outputs(runs[0], f"diagnostics_{args.player}", {"rows": rows}, md)
    print(md + f"\nwritten to {out}")
    return rows


if __name__ == "__main__":
    main()
