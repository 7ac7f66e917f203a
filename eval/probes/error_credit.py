"""Whether check errors should earn ρ_adv credit: the Figure-1 runs with the default reward against the control
``reward=errors_credited``, per seed, against targets fixed before any result was read (docs/results-laptop.md,
"Finding 2").

    python -m eval.probes.error_credit --fix runs/figure1/smoke --control runs/figure1_credited/smoke [--json OUT]

Each root is a ``make reproduce-figure1`` root. Per seed and arm: the held-out Evaluation probe's figures at
iteration 0 and the last probed one (:data:`PROBE_KEYS`, ``valid_delta``), and from training the share and mean
advantage of each verifier kind in the last iteration's Evaluation block
(:mod:`unifiedplayers.diagnostics.verifier_kinds`), ``crashes_answered`` being the prefix-crasher.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from unifiedplayers import rundir  # noqa: E402

PROBE_KEYS = ("valid", "original_errors", "adv_rejection", "originals_accepted", "discrimination")


def probe_iterations(run: Path) -> dict[int, dict[str, Optional[float]]]:
    """``{iteration: {key: value}}`` of the Evaluation probe files ``run/probes/iter<i>.evaluation.json``."""
    out = {}
    for path in (run / rundir.PROBES).glob("iter*.evaluation.json"):
        it = int(re.fullmatch(r"iter(\d+)\.evaluation\.json", path.name).group(1))
        res = json.loads(path.read_text())["evaluation"]
        errors = res.get("original_errors")
        if errors is None and res.get("verifiers"):  # older probe files: the same count, one original per question
            errors = res.get("runtime_invalid", 0) / res["verifiers"]
        out[it] = {"valid": res.get("valid"), "original_errors": errors, "adv_rejection": res.get("adv_rejection"),
                   "originals_accepted": res.get("original_acceptance"), "discrimination": res.get("discrimination")}
    return dict(sorted(out.items()))


def seed_row(run: Path) -> dict[str, Any]:
    """One seed's figures; missing parts are None."""
    from unifiedplayers.diagnostics.records import iter_records
    from unifiedplayers.diagnostics.verifier_kinds import iteration_kinds

    probes = probe_iterations(run)
    first, last = (probes.get(0), probes[max(probes)]) if probes else (None, None)
    row: dict[str, Any] = {"run": str(run), "probed": list(probes), "last": max(probes) if probes else None}
    for k in PROBE_KEYS:
        row[k] = [None if first is None else first[k], None if last is None else last[k]]
    v0, v1 = row["valid"]
    row["valid_delta"] = None if v0 is None or v1 is None or not probes or max(probes) == 0 else v1 - v0
    records = run / rundir.RECORDS
    kinds = iteration_kinds(list(iter_records(records))) if records.exists() else {}
    row["training_kinds"] = {str(it): table for it, table in kinds.items()}
    row["crashers_last"] = kinds[max(kinds)]["crashes_answered"] if kinds else None
    return row


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def compare(fix: Path, control: Path) -> dict[str, Any]:
    """Both arms seed by seed (the seeds either root holds), and the targets of the fixed arm."""
    seeds = sorted({int(p.name[4:]) for root in (fix, control) for p in root.glob("seed*") if p.name[4:].isdigit()})
    arms = {name: {s: seed_row(root / f"seed{s}") for s in seeds if (root / f"seed{s}").is_dir()}
            for name, root in (("fix", fix), ("control", control))}
    fixed = list(arms["fix"].values())
    deltas = [r["valid_delta"] for r in fixed]
    crash = [r["crashers_last"] for r in fixed if r["crashers_last"]]
    disc = {a: _mean([r["discrimination"][1] for r in arms[a].values()]) for a in arms}
    targets = {
        "valid_delta_mean_ge_0": None if _mean(deltas) is None else _mean(deltas) >= 0,
        "valid_delta_every_seed_gt_-0.10": None if None in deltas or not deltas else all(d > -0.10 for d in deltas),
        "crashers_le_15pct_with_negative_advantage": None if not crash or len(crash) < len(fixed) else all(
            c["share"] <= 0.15 and (c["advantage"] is None or c["advantage"] < 0) for c in crash),
        "discrimination_within_0.02_of_control": None if None in disc.values() else
        abs(disc["fix"] - disc["control"]) <= 0.02,
    }
    return {"seeds": seeds, "arms": arms, "valid_delta_mean": {a: _mean([r["valid_delta"] for r in arms[a].values()])
                                                                for a in arms},
            "discrimination_mean": disc, "targets": targets}


def _f(x: Optional[float], pct: bool = False, sign: bool = False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:{'+' if sign else ''}.0f} %" if pct else f"{x:{'+' if sign else ''}.2f}"


def to_markdown(res: dict[str, Any]) -> str:
    lines = ["| arm | seed | Δ valid (probe) | errors on originals (probe) | adv. rejection | originals accepted | "
             "discrimination | crashers at the last iteration: share, advantage |", "|" + "---|" * 8]
    for arm, rows in res["arms"].items():
        for s, r in rows.items():
            c = r["crashers_last"] or {}
            pair = lambda k, pct=True: f"{_f(r[k][0], pct)} → {_f(r[k][1], pct)}"  # noqa: E731
            lines.append(f"| {arm} | {s} | {_f(r['valid_delta'], sign=True)} | {pair('original_errors')} | "
                         f"{pair('adv_rejection')} | {pair('originals_accepted')} | {pair('discrimination', False)} | "
                         f"{_f(c.get('share'), True)}, {_f(c.get('advantage'), sign=True)} |")
    lines += ["", "Targets (fixed arm): " + ", ".join(f"{k}: {v}" for k, v in res["targets"].items())]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fix", type=Path, required=True, help="figure-1 root of the default reward (errors not credited)")
    ap.add_argument("--control", type=Path, required=True, help="figure-1 root of reward=errors_credited")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args(argv)
    res = compare(args.fix, args.control)
    print(to_markdown(res), end="")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
