"""The start-up refusal: :func:`check_fits` raises :class:`CapacityError` for a plan that exceeds its machine."""
from __future__ import annotations

from typing import Sequence

from unifiedplayers.capacity.hardware import Hardware
from unifiedplayers.capacity.memory import Item
from unifiedplayers.capacity.run_plan import Plan
from unifiedplayers.capacity.units import GB, GiB


class CapacityError(ValueError):
    """A run whose plan exceeds the machine it is on."""


def check_fits(plan: Plan, machine: Hardware) -> None:
    """Refuse a plan that exceeds ``machine`` (GPU memory, vLLM's KV cache, host RAM, disk), naming each item over
    its limit and the settings to change."""
    problems = []
    peak = plan.gpu_peak
    if peak is not None and machine.gpu_memory > 0 and peak.total > machine.gpu_memory:
        problems.append(_over(f"GPU memory per GPU ({_at(peak.name)})", peak.total, machine.gpu_memory, peak.items,
                              GiB, "GiB"))
    if plan.vllm_kv is not None and machine.gpu_memory > 0 and plan.vllm_kv[0] < plan.vllm_kv[1]:
        problems.append(f"vLLM KV cache: {plan.vllm_kv[0] / GiB:.1f} GiB left in rollout.gpu_memory_utilization x "
                        f"{machine.gpu_memory / GiB:.0f} GiB after its weights, < {plan.vllm_kv[1] / GiB:.1f} GiB for "
                        "one sequence of its context: raise rollout.gpu_memory_utilization or lower "
                        "rollout.max_model_len")
    host = plan.host_peak
    if host.total > machine.host_ram:
        problems.append(_over(f"host RAM per node ({_at(host.name)})", host.total, machine.host_ram, host.items, GiB,
                              "GiB"))
    problems += disk_problems(plan, machine)
    if problems:
        raise CapacityError(
            f"capacity: experiment={plan.experiment} does not fit this machine ({machine.name}):\n- "
            + "\n- ".join(problems)
            + f"\nThe plan: python -m unifiedplayers.capacity experiment={plan.experiment} (estimates; "
              "capacity.check=false starts the run anyway)")


def disk_problems(plan: Plan, machine: Hardware) -> list[str]:
    """The run directory's disk (shared by the nodes) and trainer.offload_dir's own (a node's)."""
    parked = plan.parked_on_run_disk(machine)
    problems = []
    if plan.run_disk + parked.bytes > machine.disk:
        items = plan.disk[:1] + ((parked,) if parked.bytes else ())
        problems.append(_over("disk at the run directory", plan.run_disk + parked.bytes, machine.disk, items, GB,
                              "GB", "free"))
    if machine.offload_disk is not None and plan.parked and plan.parked.bytes > machine.offload_disk:
        problems.append(_over("disk in trainer.offload_dir", plan.parked.bytes, machine.offload_disk, (plan.parked,),
                              GB, "GB", "free"))
    return problems


def _at(instant: str) -> str:
    return "at start-up" if instant == "start-up" else f"at the {instant}"


def _over(what: str, need: float, have: float, items: Sequence[Item], unit: float, name: str,
          verb: str = "available") -> str:
    top = sorted(items, key=lambda i: -i.bytes)[:3]
    largest = "; ".join(f"{i.name} {i.bytes / unit:.1f} {name} (change: {i.setting})" for i in top)
    return f"{what}: plan {need / unit:.1f} {name} > {have / unit:.1f} {name} {verb}; largest items: {largest}"
