"""Where a run ran: the CPU, its bf16 flags, the core and thread counts, torch, Python, the GPUs, and
the isolation its sandbox got.

Gradients and log-probs differ by a few 1e-6 between CPU kinds (AMX against AVX2 kernels), and a sandbox
without root lacks layers; a figure or a red CI log is traced to its machine by this record:

- each start of a run appends :func:`machine_info` and its sandbox's isolation layers to the ``machine`` list
  of its ``config.yaml`` (:func:`record_start`; a resumed run keeps the entries of its earlier starts, and the
  last is this process's; with several ranks, rank 0's); the summary prints them (:func:`machine_line`);
- ``make test`` prints :func:`machine_line` in its first lines (``tests/conftest.py``).
"""
from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

from unifiedplayers import precision


def cpuinfo_field(name: str, path: str = "/proc/cpuinfo") -> Optional[str]:
    """The value of ``name`` (``model name``, ``vendor_id``) for the first CPU of ``path``; None when absent."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def machine_info() -> dict[str, Any]:
    """This process's machine: CPU model and vendor, its bf16 flags (``precision.BF16_CPU_FLAGS`` present in
    ``/proc/cpuinfo``), cores (``os.cpu_count``) and those this process may use (its affinity), torch and the
    threads it uses now, Python, and the names of the visible GPUs (empty without CUDA)."""
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    return {
        "cpu": cpuinfo_field("model name") or platform.processor() or platform.machine(),
        "cpu_vendor": cpuinfo_field("vendor_id") or "unknown",
        "bf16_flags": sorted(precision.cpu_flags() & set(precision.BF16_CPU_FLAGS)),
        "cores": os.cpu_count(), "cores_usable": usable,
        "torch": str(torch.__version__), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "gpus": gpus,
    }


def machine_line(info: Mapping[str, Any]) -> str:
    """``info`` (:func:`machine_info`) in one line, as the summary and ``make test`` print it."""
    flags = ", ".join(info.get("bf16_flags") or []) or "none (bf16 emulated)"
    gpus = ", ".join(info.get("gpus") or []) or "no GPU"
    return (f"{info.get('cpu')} ({info.get('cpu_vendor')}; bf16 flags: {flags}), {info.get('cores')} cores "
            f"({info.get('cores_usable')} usable), torch {info.get('torch')} with {info.get('torch_threads')} "
            f"thread(s), Python {info.get('python')}, {gpus}")


def earlier_starts(config_path: Path) -> list[dict[str, Any]]:
    """The ``machine`` entries of a run's ``config.yaml`` (its earlier starts); none when it is missing or
    holds none (a run of an earlier version)."""
    from omegaconf import OmegaConf

    try:
        starts = OmegaConf.select(OmegaConf.load(config_path), "machine", default=None)
    except Exception:  # noqa: BLE001 - missing, truncated or hand-broken: the earlier starts are unknown
        return []
    return list(OmegaConf.to_container(starts)) if OmegaConf.is_list(starts) else []


def record_start(cfg: Any, first_update: int, sandbox: Any, config_path: Optional[Path] = None) -> dict[str, Any]:
    """Append this start to ``cfg.machine`` (after the earlier starts' entries, :func:`earlier_starts`): the update
    it begins with, the machine (:func:`machine_info`) and the isolation layers of its started ``sandbox``, present
    and missing with the reason, each missing layer an ``IsolationWarning`` (on stderr). ``config_path``: the
    run's ``config.yaml``, rewritten with it. Returns this start's entry."""
    from omegaconf import OmegaConf

    from unifiedplayers.sandbox.isolation import IsolationWarning, isolation_report, missing_layer_warnings

    report = isolation_report(sandbox.config, sandbox.isolation)
    for text in missing_layer_warnings(report):
        warnings.warn(text, IsolationWarning, stacklevel=2)
    entry = {"from_update": int(first_update), **machine_info(), "sandbox_isolation": report}
    cfg.machine = [*OmegaConf.to_container(cfg.machine), entry]
    if config_path is not None:
        OmegaConf.save(cfg, config_path, resolve=True)
    return entry
