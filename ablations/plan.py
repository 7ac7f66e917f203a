"""What a table of the paper costs before it is run: every member's capacity plan (``unifiedplayers.capacity``).

    python -m ablations.plan [table1 table3 ...] [--scale paper|paper_mimo_7b] [capacity options: --gpus 8 ...]

For each member of a sweep (:data:`ablations.sweeps.SWEEPS`, at ``--scale``), the plan ``make plan`` prints for its
config (GPU-hours, peak memory per GPU, host RAM, disk), then the table's total: members differ (a frozen player
trains nothing), so the total is a sum. Evaluation is not counted.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ablations.sweeps import SCALES, SWEEPS, compose_job, expand
from unifiedplayers.capacity import GiB, TB, Hardware, Plan, plan
from unifiedplayers.capacity.report import parse_args


def table_plans(table: str, scale: str, machine: Hardware) -> list[tuple[str, Plan]]:
    """(member's override directory name, its plan) for every member of ``table`` at ``scale``."""
    s = SCALES[scale]
    out = []
    for run in SWEEPS[table].multiruns(s):
        for job in expand([*run, f"experiment={s.experiment}", "capacity.check=false"]):
            cfg, dirname = compose_job(job)
            name = ",".join(o for o in dirname.split(",") if not o.startswith("capacity.check="))
            out.append((name or "(the full method)", plan(cfg, machine)))
    return out


def report(table: str, plans: Sequence[tuple[str, Plan]]) -> float:
    """Print one line per member and the table's total GPU-hours; returns that total."""
    print(f"{table}: {len(plans)} members")
    print(f"  {'member':<72} {'GPU-h':>7} {'GPU GiB':>8} {'host GiB':>9} {'disk TB':>8}")
    total = 0.0
    for name, p in plans:
        hours = p.gpu_hours or 0.0
        total += hours
        peak = p.gpu_peak.total / GiB if p.gpu_peak else 0.0
        print(f"  {name[:72]:<72} {hours:7.0f} {peak:8.1f} {p.host_peak.total / GiB:9.1f} {p.run_disk / TB:8.2f}")
    print(f"  total: {total:.0f} GPU-hours (evaluation not counted)")
    return total


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="*", default=[], help=f"of {', '.join(SWEEPS)} (default: all)")
    ap.add_argument("--scale", default="paper", choices=[k for k, v in SCALES.items() if v.gpus])
    args, rest = ap.parse_known_args(argv)
    unknown = [t for t in args.tables if t not in SWEEPS]
    if unknown:
        ap.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(SWEEPS)}")
    machine, overrides = parse_args(rest)
    if overrides:
        ap.error(f"config overrides are not taken here (each member composes its own): {' '.join(overrides)}")
    grand = sum(report(t, table_plans(t, args.scale, machine)) for t in args.tables or list(SWEEPS))
    print(f"all: {grand:.0f} GPU-hours at scale {args.scale} on {machine.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
