"""Verifier discrimination: how well the verifier pool tells original trajectories from perturbed ones
(§4.5, Figure 3c), at verifier and pool level, per rule and overall; the definitions are in eval/README.md.
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


def _errors(rec: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The record's error mask ``name`` (all False where the record has none)."""
    e = getattr(rec, name, None)
    return np.zeros(shape, dtype=bool) if e is None else np.asarray(e, dtype=bool).reshape(shape)


def _majority(z: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pool's verdict over axis 0 from the completed checks only: accept when more than half of them accept;
    ``done`` False where no check completed (no verdict)."""
    n = done.sum(axis=0, keepdims=True)
    accepts = (z * done).sum(axis=0, keepdims=True)
    return (accepts > n / 2).astype(float), n > 0


def discrimination(records: Sequence[Any]) -> dict[str, Any]:
    """Accuracies per rule and overall, at verifier and pool level."""
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
            done_orig, done_adv = ~_errors(rec, "error_orig", z_orig.shape), ~_errors(rec, "error_adv", z_adv.shape)
            if level == "pool":
                z_orig, done_orig = _majority(z_orig, done_orig)
                z_adv, done_adv = _majority(z_adv, done_adv)
            orig["right"] += z_orig.sum()  # an errored check is a 0 in Z already: never an acceptance
            orig["total"] += z_orig.size
            for j, rule in enumerate(rec.rules):
                applied = mask[:, j]  # (K,)
                rejected = (1.0 - z_adv[:, applied, j]) * done_adv[:, applied, j]  # (rows, applied K)
                c = per_rule.setdefault(rule, _counts())
                c["right"] += rejected.sum()
                c["total"] += rejected.size
                adv_all["right"] += rejected.sum()
                adv_all["total"] += rejected.size
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
