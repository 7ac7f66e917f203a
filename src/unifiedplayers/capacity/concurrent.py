"""Runs started together on one node (``experiments/dp8_single_gpu_runs.sh``), whose start-up checks each see only
their own plan: :func:`runs_that_fit` checks their sum, in launch order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from unifiedplayers.capacity.hardware import Hardware
from unifiedplayers.capacity.run_plan import Plan
from unifiedplayers.capacity.units import GB, TB, GiB


@dataclass(frozen=True)
class Need:
    """What one run takes of the node: host RAM at its peak, disk at the run directory (with its parked state when
    trainer.offload_dir lies there) and in trainer.offload_dir (when it does not)."""

    host_ram: float
    disk: float
    offload_disk: float

    def __add__(self, other: "Need") -> "Need":
        return Need(self.host_ram + other.host_ram, self.disk + other.disk, self.offload_disk + other.offload_disk)


def run_need(plan: Plan, machine: Hardware) -> Need:
    parked = plan.parked.bytes if plan.parked else 0.0
    return Need(plan.host_peak.total, plan.run_disk + plan.parked_on_run_disk(machine).bytes,
                parked if machine.offload_disk is not None else 0.0)


def fits(need: Need, machine: Hardware) -> bool:
    return (need.host_ram <= machine.host_ram and need.disk <= machine.disk
            and (machine.offload_disk is None or need.offload_disk <= machine.offload_disk))


def runs_that_fit(plans: Sequence[Plan], machine: Hardware) -> int:
    """How many of ``plans``, in order, fit ``machine`` together: host RAM peaks summed (runs of one schedule, started
    together, peak together) and disks summed."""
    total = Need(0.0, 0.0, 0.0)
    for k, p in enumerate(plans):
        total = total + run_need(p, machine)
        if not fits(total, machine):
            return k
    return len(plans)


def format_together(labels: Sequence[str], plans: Sequence[Plan], machine: Hardware) -> str:
    """Each run's need and the running sums (a run's label is its directory's own name), how many fit (+) and, when
    not all, which of the node's limits the next one would pass."""
    fit, offload = runs_that_fit(plans, machine), machine.offload_disk is not None
    names = [label.rstrip("/").rsplit("/", 1)[-1] or label for label in labels]
    width = max([len(n) for n in names] + [3])
    lines = [f"{len(plans)} run(s) started together on one node ({machine.name}):",
             f"  {'run':<{width}} {'host RAM GiB':>13} {'disk GB':>9}" + (f" {'offload GB':>11}" if offload else "")
             + f" {'sum GiB':>9} {'sum GB':>9}" + (f" {'sum off GB':>11}" if offload else "")]
    total = Need(0.0, 0.0, 0.0)
    for k, (name, p) in enumerate(zip(names, plans)):
        need = run_need(p, machine)
        total = total + need
        lines.append(f"{'+' if k < fit else '-'} {name:<{width}} {need.host_ram / GiB:>13.1f} {need.disk / GB:>9.1f}"
                     + (f" {need.offload_disk / GB:>11.1f}" if offload else "")
                     + f" {total.host_ram / GiB:>9.1f} {total.disk / GB:>9.1f}"
                     + (f" {total.offload_disk / GB:>11.1f}" if offload else ""))
    have = (f"{machine.host_ram / GiB:.0f} GiB host RAM and {machine.disk / TB:.2f} TB disk"
            + (f" ({machine.offload_disk / TB:.2f} TB in trainer.offload_dir)" if offload else ""))
    lines.append(f"Together: {total.host_ram / GiB:.0f} GiB host RAM and {total.disk / TB:.2f} TB disk"
                 + (f" ({total.offload_disk / TB:.2f} TB in trainer.offload_dir)" if offload else "")
                 + f"; the node has {have}.")
    if fit == len(plans):
        lines.append(f"All {len(plans)} fit.")
    else:
        upto = sum((run_need(p, machine) for p in plans[:fit + 1]), Need(0.0, 0.0, 0.0))
        lines.append(f"{fit} of {len(plans)} fit together (+); with the next, the first {fit + 1} would need "
                     f"{passed(upto, machine)}." if fit else f"None fits: the first alone would need "
                                                              f"{passed(upto, machine)}.")
    return "\n".join(lines)


def passed(need: Need, machine: Hardware) -> str:
    """The limits of ``machine`` that ``need`` passes, with both figures."""
    over = []
    if need.host_ram > machine.host_ram:
        over.append(f"{need.host_ram / GiB:.1f} GiB host RAM > {machine.host_ram / GiB:.1f} GiB available")
    if need.disk > machine.disk:
        over.append(f"{need.disk / GB:.1f} GB disk at the run directories > {machine.disk / GB:.1f} GB free")
    if machine.offload_disk is not None and need.offload_disk > machine.offload_disk:
        over.append(f"{need.offload_disk / GB:.1f} GB in trainer.offload_dir > {machine.offload_disk / GB:.1f} GB "
                    "free")
    return " and ".join(over)
