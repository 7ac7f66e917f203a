"""Verifier discrimination: how well the verifier pool tells original trajectories from perturbed ones
(paper §4.5 and Figure 3c: 84.2%).

From each record ξ(q): Z_orig (M_q, K), Z_adv (M_q, K, P) and the mask of applied perturbations
(K, P). A verdict is *right* when it accepts an original (Z = 1) or rejects a perturbation (Z = 0).

- ``verifier`` level: every (valid verifier, trajectory) verdict counts.
- ``pool`` level: one verdict per trajectory, the strict majority of the valid verifiers (accept when
  more than half accept; a tie rejects).

Per rule j: accuracy on originals (acceptance), on perturbations of rule j (rejection), and their
mean, the balanced accuracy. Overall: the balanced accuracy over all rules (originals vs all
perturbations) and the raw accuracy over all verdicts (dominated by the P-times more perturbations).
The headline is the verifier-level balanced accuracy. Originals are not checked for correctness: an
original with a wrong answer that the pool rejects counts as a miss, as in the paper's metric.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from eval.analysis.rundir import RunData, single_run_main
from eval.paper_numbers import GPT4O_DISCRIMINATION_ACCURACY, VERIFIER_DISCRIMINATION_ACCURACY


def _counts() -> dict[str, float]:
    return {"right": 0.0, "total": 0.0}


def _ratio(c: dict[str, float]) -> Optional[float]:
    return c["right"] / c["total"] if c["total"] else None


def _balanced(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else 0.5 * (a + b)


def discrimination(records: Sequence[Any]) -> dict[str, Any]:
    """Accuracies per rule and overall, at verifier and pool level (see the module docstring)."""
    levels = {}
    for level in ("verifier", "pool"):
        orig, adv_all = _counts(), _counts()
        per_rule: dict[str, dict[str, float]] = {}
        for rec in records:
            z_orig = np.asarray(rec.z_orig, dtype=float)
            z_adv = np.asarray(rec.z_adv, dtype=float)
            mask = np.asarray(rec.adv_mask, dtype=bool)
            m_q = z_orig.shape[0]
            if m_q == 0:
                continue  # no valid verifier: no verdicts
            if level == "pool":
                z_orig = (z_orig.mean(axis=0, keepdims=True) > 0.5).astype(float)
                z_adv = (z_adv.mean(axis=0, keepdims=True) > 0.5).astype(float)
            orig["right"] += z_orig.sum()
            orig["total"] += z_orig.size
            for j, rule in enumerate(rec.rules):
                applied = mask[:, j]  # (K,)
                verdicts = z_adv[:, applied, j]  # (rows, applied K)
                c = per_rule.setdefault(rule, _counts())
                c["right"] += (1.0 - verdicts).sum()
                c["total"] += verdicts.size
                adv_all["right"] += (1.0 - verdicts).sum()
                adv_all["total"] += verdicts.size
        acc_orig, acc_adv = _ratio(orig), _ratio(adv_all)
        rules = {}
        for rule, c in per_rule.items():
            rej = _ratio(c)
            rules[rule] = {"rejection": rej, "balanced_accuracy": _balanced(acc_orig, rej), "n": int(c["total"])}
        raw = (orig["right"] + adv_all["right"]) / (orig["total"] + adv_all["total"]) if orig["total"] + adv_all["total"] else None
        levels[level] = {
            "original_acceptance": acc_orig, "n_original": int(orig["total"]),
            "perturbation_rejection": acc_adv, "n_perturbed": int(adv_all["total"]),
            "balanced_accuracy": _balanced(acc_orig, acc_adv), "raw_accuracy": raw, "per_rule": rules,
        }
    return {
        "num_tasks": len(records),
        "num_tasks_with_valid_verifier": sum(np.asarray(r.z_orig).shape[0] > 0 for r in records),
        "levels": levels,
        "headline": levels["verifier"]["balanced_accuracy"],
        "paper": {"ours": VERIFIER_DISCRIMINATION_ACCURACY, "gpt4o": GPT4O_DISCRIMINATION_ACCURACY},
    }


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def to_markdown(result: dict[str, Any]) -> str:
    rules = sorted({r for lv in result["levels"].values() for r in lv["per_rule"]})
    lines = [
        "**Verifier discrimination** (originals vs perturbations; accuracies in %)", "",
        f"Tasks: {result['num_tasks']} ({result['num_tasks_with_valid_verifier']} with a valid verifier). "
        f"Paper: {100 * result['paper']['ours']:.1f} (GPT-4o {100 * result['paper']['gpt4o']:.1f}).", "",
        "| level | originals accepted | perturbations rejected | " + " | ".join(rules) + " | balanced | raw |",
        "|" + "---|" * (len(rules) + 5),
    ]
    for level, lv in result["levels"].items():
        per = [_pct(lv["per_rule"].get(r, {}).get("balanced_accuracy")) for r in rules]
        lines.append(f"| {level} | {_pct(lv['original_acceptance'])} | {_pct(lv['perturbation_rejection'])} | "
                     + " | ".join(per) + f" | {_pct(lv['balanced_accuracy'])} | {_pct(lv['raw_accuracy'])} |")
    lines += ["", "Per-rule columns: balanced accuracy of originals vs that rule's perturbations."]
    return "\n".join(lines) + "\n"


def analyse(run: RunData) -> dict[str, Any]:
    return discrimination(run.played_records())


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    return single_run_main(argv, "Verifier discrimination accuracy from a run directory", "discrimination",
                           analyse, to_markdown, need_records=True)


if __name__ == "__main__":
    main()
