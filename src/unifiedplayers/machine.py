"""Where a run ran (CPU and its bf16 flags, cores, threads, torch, Python, GPUs) and the isolation its sandbox got,
so that a figure or a red CI log is traced to its machine: each start of a run appends it to its ``config.yaml``
(:func:`record_start`), and the summary and ``make test`` print it (:func:`machine_line`). Also the start-up check
of a GPU that torch cannot use (:func:`check_gpu_usable`).
"""
from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

from unifiedplayers import precision
from unifiedplayers.precision import cpuinfo_field


def machine_info() -> dict[str, Any]:
    """This process's machine, the cores it may use (its affinity) and the threads torch uses now."""
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
    """The ``machine`` entries of a run's ``config.yaml`` (its earlier starts); none when it is missing or holds
    none."""
    from omegaconf import OmegaConf

    try:
        starts = OmegaConf.select(OmegaConf.load(config_path), "machine", default=None)
    except Exception:  # noqa: BLE001 - missing, truncated or hand-broken: the earlier starts are unknown
        return []
    return list(OmegaConf.to_container(starts)) if OmegaConf.is_list(starts) else []


def record_start(cfg: Any, first_update: int, sandbox: Any, config_path: Optional[Path] = None) -> dict[str, Any]:
    """Append this start's entry to ``cfg.machine`` and return it: the update it begins with, :func:`machine_info`
    and the isolation layers of its started ``sandbox`` (each missing one also an ``IsolationWarning``).
    ``config_path``: the run's ``config.yaml``, rewritten with it."""
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


# The least NVIDIA driver each CUDA major release runs on (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and
# Corresponding Driver Versions", Linux). vLLM 0.32 pins torch 2.13.0, whose Linux wheel on PyPI is the CUDA 13 build.
MIN_DRIVER = {13: "580", 12: "525", 11: "450"}


def nvidia_smi_gpus(command: str = "nvidia-smi") -> list[tuple[str, str]]:
    """``(name, driver version)`` of each GPU ``nvidia-smi`` lists (none where it fails), read without starting CUDA."""
    import subprocess

    try:
        out = subprocess.run([command, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    rows = [line.rsplit(",", 1) for line in out.stdout.splitlines() if "," in line]
    return [(name.strip(), driver.strip()) for name, driver in rows]


def gpu_unusable(gpus: list[tuple[str, str]], cuda_available: bool, torch_version: str,
                 torch_cuda: Optional[str]) -> Optional[str]:
    """Why torch cannot use the ``gpus`` ``nvidia-smi`` lists, and what to install; None when it can or there is none.
    ``torch_cuda``: ``torch.version.cuda`` (None: a CPU build)."""
    if cuda_available or not gpus:
        return None
    name, driver = gpus[0]
    found = f"nvidia-smi lists {len(gpus)} GPU(s) ({name}, driver {driver}), but torch {torch_version} cannot use them"
    if torch_cuda is None:
        return (f"{found}: it is a CPU build. Install the CUDA build that vLLM's window pins (pip install "
                "torch==2.13.0 from PyPI, whose Linux wheel is built for CUDA 13, or `pip install -e '.[gpu]'`).")
    need = MIN_DRIVER.get(int(torch_cuda.split(".")[0]))
    major = driver.split(".")[0]
    if need and major.isdigit() and int(major) < int(need):
        return (f"{found}: it is built for CUDA {torch_cuda}, which needs an NVIDIA driver {need} or newer. Install a "
                f"driver of the {need} series or newer, or NVIDIA's CUDA forward-compatibility package for CUDA "
                f"{torch_cuda.split('.')[0]} (cuda-compat; data-center GPUs only) and put its libcuda first on "
                "LD_LIBRARY_PATH. A torch built for an older CUDA would run on this driver, but vLLM 0.32 pins "
                "torch 2.13.0's CUDA 13 build (README, \"Tested versions\").")
    return (f"{found}, although it is built for CUDA {torch_cuda} and the driver is new enough for it: check "
            "CUDA_VISIBLE_DEVICES (empty or naming no GPU hides them), the job's GPU allocation, and that "
            "`python -c 'import torch; torch.cuda.init()'` says why.")


def check_gpu_usable(device: str) -> None:
    """Where ``nvidia-smi`` finds a GPU that torch cannot use (:func:`gpu_unusable`), ``model.device`` ``cuda`` stops
    with the reason and ``auto`` (which would fall back to the CPU) warns with it."""
    if not (device.startswith("cuda") or device == "auto"):
        return
    import torch

    if torch.cuda.is_available():
        return
    problem = gpu_unusable(nvidia_smi_gpus(), False, str(torch.__version__), torch.version.cuda)
    if problem is None:
        return
    if device == "auto":
        warnings.warn(f"model.device=auto runs on the CPU: {problem}", stacklevel=2)
        return
    raise RuntimeError(f"model.device={device}: {problem}")
