"""What kinds of verifier the Evaluation reward favours: ``python -m eval.analysis.verifier_kinds RUN_DIR``.

Per kind (:mod:`unifiedplayers.feedback.kinds`): the count, mean r_C, mean ρ_red and mean GRPO advantage
(:mod:`unifiedplayers.diagnostics.verifier_kinds`), for all records, the Evaluation blocks and each outer iteration;
eval/README.md says why it matters (Eq. 5).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from eval.analysis.rundir import RunData, single_run_main
from unifiedplayers.feedback.kinds import KINDS, LABELS


def _empty() -> dict[str, list[float]]:
    return {k: [] for k in ("reward", "advantage", "rho_red")}


def _table(acc: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    n_all = sum(len(acc[k]["reward"]) for k in KINDS)
    out = {}
    for k in KINDS:
        r, a, red = acc[k]["reward"], acc[k]["advantage"], acc[k]["rho_red"]
        out[k] = {"n": len(r), "share": (len(r) / n_all) if n_all else None,
                  "mean_reward": float(np.mean(r)) if r else None, "mean_advantage": float(np.mean(a)) if a else None,
                  "mean_rho_red": float(np.mean(red)) if red else None}  # valid verifiers only
    return out


def verifier_kinds(records: Sequence[Any], eps: float = 1e-6) -> dict[str, Any]:
    """Kinds, rewards and advantages of the generated verifiers of ``records``."""
    from unifiedplayers.diagnostics.verifier_kinds import record_kinds
    from unifiedplayers.feedback.rewards import per_generated

    scopes: dict[str, dict[str, dict[str, list[float]]]] = {}
    answered: dict[str, list[float]] = {}
    for rec in records:
        rewards = (rec.rewards or {}).get("evaluation")
        if not rewards or rec.num_generated == 0 or len(rewards) != rec.num_generated:
            continue  # a verdict-free method, or a record without Evaluation rewards
        kinds, adv = record_kinds(rec, eps)
        red = per_generated(rec.redundancy, rec.valid, rec.num_generated, np.nan)  # NaN: invalid, no ρ_red
        block = (rec.meta or {}).get("block")
        names = ["all", f"iteration {rec.iteration}"]
        if block == "evaluation":
            names.append("trained (evaluation blocks)")
        share = float(np.mean([t.final_answer is not None for t in rec.trajectories])) if rec.trajectories else None
        for i, kind in enumerate(kinds):
            for name in names:
                acc = scopes.setdefault(name, {k: _empty() for k in KINDS})
                acc[kind]["reward"].append(float(rewards[i]))
                acc[kind]["advantage"].append(float(adv[i]))
                if not np.isnan(red[i]):
                    acc[kind]["rho_red"].append(float(red[i]))
        if share is not None:
            for name in names:
                answered.setdefault(name, []).append(share)
    order = sorted(scopes, key=lambda n: (n != "all", not n.startswith("trained"), n))  # all, trained, iterations
    return {name: {"kinds": _table(scopes[name]),
                   "originals_answered": float(np.mean(answered[name])) if answered.get(name) else None}
            for name in order}


def _f(x: Optional[float], pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.0f}%" if pct else f"{x:+.2f}"


def to_markdown(result: dict[str, Any]) -> str:
    lines = ["**Verifier kinds** (what the Evaluation reward favours; advantage: mean GRPO advantage within "
             "the record's M verifiers; ρ_red: mean redundancy of the kind's valid verifiers)", "",
             "| records | originals answered | " + " | ".join(f"{LABELS[k]}: share, r_C, advantage, ρ_red" for k in KINDS)
             + " |",
             "|" + "---|" * (len(KINDS) + 2)]
    for name, row in result.items():
        cells = [f"{_f(v['share'], True)}, {_f(v['mean_reward'])}, {_f(v['mean_advantage'])}, "
                 f"{'–' if v['mean_rho_red'] is None else format(v['mean_rho_red'], '.2f')}"
                 for v in row["kinds"].values()]
        lines.append(f"| {name} | {_f(row['originals_answered'], True)} | " + " | ".join(cells) + " |")
    lines += ["", "A response prefix that writes part of `check()` for every verifier (the smoke presets' "
              "`player.evaluation.response_prefix` writes about half of it) makes all verifiers of a task share "
              "those tokens: ρ_red is then about 0.8 for every kind, and γ ρ_red takes about the same off each."]
    return "\n".join(lines) + "\n"


def analyse(run: RunData) -> dict[str, Any]:
    return verifier_kinds(run.played_records())


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    return single_run_main(argv, "Kinds of verifier and what the Evaluation reward gives each", "verifier_kinds",
                           analyse, to_markdown, need_records=True)


if __name__ == "__main__":
    main()
