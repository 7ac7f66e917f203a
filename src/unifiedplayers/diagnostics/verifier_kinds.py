"""What the Evaluation reward pays each kind of verifier: shares and mean GRPO advantages.

The kinds are :mod:`unifiedplayers.feedback.kinds`'. A verifier's advantage is Eq. 17's within its task's group of
M verifiers (on the Evaluation rewards r_C): a kind with a positive mean advantage is what the Evaluation player's
updates make more likely. The training metrics, the summary and ``eval/analysis/verifier_kinds.py`` all read
:func:`task_kinds_and_advantages`.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from unifiedplayers.feedback.kinds import KINDS, LABELS, task_kinds
from unifiedplayers.trainer.grpo import group_advantages

ADV_EPS = 1e-6  # ε of Eq. 17, as trainer.adv_eps defaults


def task_kinds_and_advantages(num_generated: int, valid: Sequence[int], z_orig: Any, z_adv: Any, adv_mask: Any,
                              error_orig: Any, answers: Sequence[Optional[str]], rewards: Optional[Sequence[float]],
                              eps: float = ADV_EPS) -> tuple[list[str], list[Optional[float]]]:
    """Each generated verifier's kind and its advantage within the task's M (None without Evaluation rewards)."""
    kinds = task_kinds(num_generated, valid, z_orig, z_adv, adv_mask, error_orig, [a is not None for a in answers])
    if rewards is None or num_generated == 0 or len(rewards) != num_generated:
        return kinds, [None] * num_generated
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float64)
    adv = group_advantages(r, torch.zeros(num_generated, dtype=torch.long), eps=eps).tolist()
    return kinds, adv


def record_kinds(rec: Any, eps: float = ADV_EPS) -> tuple[list[str], list[Optional[float]]]:
    """:func:`task_kinds_and_advantages` of one interaction record."""
    return task_kinds_and_advantages(rec.num_generated, rec.valid, rec.z_orig, rec.z_adv, rec.adv_mask, rec.error_orig,
                                     [t.final_answer for t in rec.trajectories],
                                     (rec.rewards or {}).get("evaluation"), eps)


def kinds_of(rows: Sequence[tuple[list[str], list[Optional[float]]]]) -> dict[str, dict[str, Optional[float]]]:
    """Per kind over several tasks' (kinds, advantages): ``n``, ``share`` of all their verifiers (None without
    any) and ``advantage``, the mean over the kind's verifiers that have one (None where none has)."""
    n_all = sum(len(ks) for ks, _ in rows)
    out: dict[str, dict[str, Optional[float]]] = {}
    for kind in KINDS:
        n = sum(k == kind for ks, _ in rows for k in ks)
        adv = [a for ks, advs in rows for k, a in zip(ks, advs) if k == kind and a is not None]
        out[kind] = {"n": n, "share": n / n_all if n_all else None, "advantage": float(np.mean(adv)) if adv else None}
    return out


def kind_metrics(rows: Sequence[tuple[list[str], list[Optional[float]]]]) -> dict[str, Optional[float]]:
    """The metrics line's ``evaluation/kind/<kind>/share`` and ``.../advantage`` (None without verifiers)."""
    table = kinds_of(rows)
    return {f"evaluation/kind/{kind}/{what}": table[kind][what] for kind in KINDS for what in ("share", "advantage")}


def iteration_kinds(records: Sequence[Any], block: Optional[str] = "evaluation") -> dict[int, dict[str, Any]]:
    """``{outer iteration: kind table}`` over the records of ``block`` (None: every record) that have Evaluation
    rewards for all their verifiers (a verdict-free method's records are left out)."""
    rows: dict[int, list] = {}
    for rec in records:
        if block is not None and (rec.meta or {}).get("block") != block:
            continue
        r = (rec.rewards or {}).get("evaluation")
        if r is None or rec.num_generated == 0 or len(r) != rec.num_generated:
            continue
        rows.setdefault(-1 if rec.iteration is None else int(rec.iteration), []).append(record_kinds(rec))
    return {it: kinds_of(rows[it]) for it in sorted(rows)}


def kinds_lines(per_iteration: dict[int, dict[str, Any]]) -> list[str]:
    """The summary's table: one row per outer iteration, share and mean advantage of each kind."""
    if not per_iteration:
        return []
    head = "| iteration | " + " | ".join(f"{LABELS[k]}: share, advantage" for k in KINDS) + " |"
    out = ["## Verifier kinds in the Evaluation blocks (share of generated verifiers, mean GRPO advantage)", "",
           head, "|" + "---|" * (len(KINDS) + 1)]
    for it, table in per_iteration.items():
        cells = []
        for k in KINDS:
            s, a = table[k]["share"], table[k]["advantage"]
            cells.append(("–" if s is None else f"{100 * s:.0f}%") + ", " + ("–" if a is None else f"{a:+.2f}"))
        out.append(f"| {it} | " + " | ".join(cells) + " |")
    return out + [""]
