"""Which floating-point precision a run uses (``model.dtype``, ``trainer.dtype``), and ``auto``: bfloat16 where the
hardware multiplies it natively (a GPU with bf16 support, a CPU with ``amx_bf16`` or ``avx512_bf16``; elsewhere it
is emulated, slower than float32), float32 elsewhere. A run resolves ``auto`` once, at its start
(:func:`resolve_run_precision`), and keeps that dtype when resumed, even on another machine.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
SETTINGS = ("auto",) + DTYPE_NAMES
PRECISION_KEYS = ("model.dtype", "trainer.dtype")
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


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


@functools.lru_cache(maxsize=None)
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The flags of the first CPU in ``path`` (empty where the file is missing: not Linux)."""
    return frozenset((cpuinfo_field("flags", path) or "").split())


def native_bf16(device: str = "cpu") -> tuple[bool, str]:
    """(whether ``device`` multiplies bf16 natively, the reason in words). ``device``: cpu | cuda | cuda:N | auto."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False, f"device {device!r} asked for, but no GPU is visible"
        name = torch.cuda.get_device_name(torch.device(device))
        if torch.cuda.is_bf16_supported():
            return True, f"GPU {name} supports bf16"
        return False, f"GPU {name} has no bf16 support"
    found = sorted(cpu_flags() & set(BF16_CPU_FLAGS))
    if found:
        return True, f"CPU has {' and '.join(found)}"
    return False, "CPU has neither amx_bf16 nor avx512_bf16: bf16 would be emulated, slower than float32"


def auto_dtype(device: str = "cpu") -> tuple[str, str]:
    """(dtype name, reason) that ``auto`` resolves to on ``device``."""
    native, why = native_bf16(device)
    return ("bfloat16", why) if native else ("float32", why)


def check_setting(key: str, value: Any) -> str:
    """``value`` as a dtype setting of ``key``; an unknown one is an error naming the known ones."""
    if value not in SETTINGS:
        raise ValueError(f"{key}={value!r} is not one of {list(SETTINGS)}")
    return str(value)


def torch_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """The torch dtype of a setting (``auto`` resolved on ``device``)."""
    if check_setting("dtype", name) == "auto":
        name = auto_dtype(device)[0]
    return getattr(torch, name)


def resolve_run_precision(cfg: Any, stored: Optional[Mapping[str, Any]] = None) -> str:
    """Replace ``auto`` in ``cfg.model.dtype`` and ``cfg.trainer.dtype`` by a dtype and return the reason, also set as
    ``cfg.precision_reason``. ``stored``: a resumed run's flattened config (``state.pt``), whose dtypes win."""
    device = str(cfg.model.device)
    reasons = []
    for key in PRECISION_KEYS:
        group, name = key.split(".")
        value = check_setting(key, getattr(cfg[group], name))
        if value != "auto":
            continue
        kept = stored.get(key) if stored is not None else None
        if kept in DTYPE_NAMES:
            chosen, why = kept, f"resumed run: kept the dtype chosen at its start ({stored.get('precision_reason')})"
        else:
            chosen, why = auto_dtype(device)
        cfg[group][name] = chosen
        reasons.append(f"{key}=auto -> {chosen}: {why}")
    if reasons:
        cfg.precision_reason = "; ".join(reasons)
    return str(cfg.precision_reason or "")


def matches_stored(key: str, now: Any, then: Any) -> bool:
    """Whether a resume with ``now`` continues a run stored with ``then`` for a precision key: ``auto`` takes the
    stored dtype, and ``precision_reason`` is a record of the run's start, not a setting."""
    if key == "precision_reason":
        return True
    return key in PRECISION_KEYS and now == "auto" and then in DTYPE_NAMES
