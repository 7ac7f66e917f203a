"""A run's state on disk (:mod:`unifiedplayers.schedule`): atomic writes, and the config a resumed run must
share with the run it continues."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

# Config keys that may change between a run and its resumption (they steer this process, not the result).
RUN_CONTROL_KEYS = ("resume", "run_dir", "logger", "schedule.max_updates", "schedule.print_summary",
                    "schedule.checkpoint_retention")


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def result_config(cfg: Any) -> dict[str, Any]:
    """The composed config minus the run-control keys: what must not change when a run is resumed."""
    flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in flat.items() if not any(k == c or k.startswith(c + ".") for c in RUN_CONTROL_KEYS)}


def is_schema_default(key: str, value: Any) -> bool:
    """Whether ``value`` is the typed schema's default for ``key``: a setting added to the code after a run
    started, left at its default, is no change to that run (it behaves as before)."""
    from unifiedplayers.config import Config

    try:
        default = OmegaConf.select(OmegaConf.structured(Config), key, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation or a node without a default: treat as a change
        return False
    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default, resolve=False)
    return default is not None and default == value
