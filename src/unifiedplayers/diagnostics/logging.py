"""Run metrics: ``metrics.jsonl`` in the run directory (always) and Weights & Biases (``conf/logger/``).

W&B runs offline by default (files under ``<run_dir>/wandb``), online with ``logger=wandb_online`` and not at all
with ``logger=none``. A W&B failure is a warning, never a crash: ``metrics.jsonl`` is the record of the run.
Progress bars (tqdm) go to stderr and can be turned off with ``logger.progress=false``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional

from tqdm.auto import tqdm

from unifiedplayers.rundir import METRICS, WANDB, read_jsonl

# Seconds wandb.init may wait for the W&B server in online mode before the run falls back to offline (wandb's own
# default, 90 s, would stall every start of a machine without a network).
WANDB_INIT_TIMEOUT_S = 15.0


def wandb_init_timeout(cfg: Any = None) -> float:
    """How long an online ``wandb.init`` may wait: ``$WANDB_INIT_TIMEOUT`` (wandb's own variable), else
    ``cfg.init_timeout_s`` where the logger config has that key, else ``WANDB_INIT_TIMEOUT_S``."""
    env = os.environ.get("WANDB_INIT_TIMEOUT")
    if env:
        return float(env)
    value = getattr(cfg, "init_timeout_s", None) if cfg is not None else None
    return float(value) if value is not None else WANDB_INIT_TIMEOUT_S


def init_wandb(mode: str, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
    """``wandb.init(mode=mode, **kwargs)``. Online, the wait for the server is bounded by ``timeout_s`` (default
    :func:`wandb_init_timeout`); when it fails (no network, no answer, a rejected key) the run is started offline
    instead (``wandb sync`` uploads it later), with a warning. Errors of the offline init itself propagate."""
    import wandb

    if mode != "online":
        return wandb.init(mode=mode, **kwargs)
    timeout_s = wandb_init_timeout() if timeout_s is None else float(timeout_s)
    t0 = time.monotonic()
    try:
        return wandb.init(mode="online", settings=wandb.Settings(init_timeout=timeout_s), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any online failure: offline keeps the metrics
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        where = Path(kwargs.get("dir") or ".") / WANDB
        msg = (f"W&B online init failed after {time.monotonic() - t0:.0f} s (timeout {timeout_s:g} s; {reason}); "
               f"falling back to offline mode: the run is logged under {where}/offline-run-* (`wandb sync` "
               f"uploads it later). Set WANDB_INIT_TIMEOUT=<seconds> to wait longer, or logger=wandb_offline.")
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    print(f"[logger] {msg}", flush=True)
    with contextlib.suppress(Exception):  # the service still holds the failed run (its id "in use"): start afresh
        wandb.teardown()
    return wandb.init(mode="offline", **kwargs)


def wandb_run_name(cfg: Any, run_dir: Path, config: Optional[dict] = None) -> str:
    """The W&B run's display name: ``logger.name`` when set, else ``<experiment>/<run dir's last component>``
    (``smoke/smoke``, ``paper_qwen3_4b/seed0``; ``run`` stands in for a config without ``experiment``)."""
    name = getattr(cfg, "name", None)
    if name:
        return str(name)
    experiment = (config or {}).get("experiment") or "run"
    return f"{experiment}/{Path(run_dir).resolve().name}"


def _clean(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    return value


class RunLogger:
    """Appends one JSON line per call to ``<run_dir>/metrics.jsonl`` (durably) and mirrors it to W&B."""

    def __init__(self, run_dir: Path, cfg: Any, config: Optional[dict] = None, run_id: Optional[str] = None) -> None:
        self.path = Path(run_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")
        self.cfg = cfg
        self.wandb = None
        self.wandb_mode: Optional[str] = None  # the mode W&B runs in: cfg.mode, or offline after a fallback
        if cfg.backend == "wandb" and cfg.mode != "disabled":
            self.wandb = self._init_wandb(Path(run_dir), config, run_id)
        elif cfg.backend not in ("wandb", "none"):
            raise ValueError(f"logger.backend={cfg.backend!r}: wandb | none")

    def _init_wandb(self, run_dir: Path, config: Optional[dict], run_id: Optional[str]):
        try:
            os.environ.setdefault("WANDB_SILENT", "true")
            run = init_wandb(self.cfg.mode, timeout_s=wandb_init_timeout(self.cfg), project=self.cfg.project,
                             entity=self.cfg.entity, name=wandb_run_name(self.cfg, run_dir, config),
                             group=self.cfg.group, tags=list(self.cfg.tags) or None, dir=str(run_dir), config=config,
                             id=run_id, resume="allow" if run_id else None)
            self.wandb_mode = getattr(getattr(run, "settings", None), "mode", None) or str(self.cfg.mode)
            return run
        except Exception as exc:  # W&B is a mirror; the run goes on without it
            warnings.warn(f"W&B disabled: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def log(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        clean = {k: _clean(v) for k, v in metrics.items()}
        self._f.write((json.dumps(clean, sort_keys=True) + "\n").encode("utf-8"))
        self._f.flush()
        os.fsync(self._f.fileno())
        if self.wandb is not None:
            try:
                self.wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=step)
            except Exception as exc:
                warnings.warn(f"W&B log failed: {exc}", RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if self.wandb is not None:
            with contextlib.suppress(Exception):
                self.wandb.finish()
            self.wandb = None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``<run_dir>/metrics.jsonl`` (:func:`unifiedplayers.rundir.read_jsonl`)."""
    return read_jsonl(Path(run_dir) / METRICS)


def progress(iterable: Optional[Iterable] = None, *, total: Optional[int] = None, desc: str = "",
             enabled: bool = True, leave: bool = False, position: Optional[int] = None, initial: int = 0):
    """A tqdm bar (that draws nothing when ``enabled`` is false)."""
    return tqdm(iterable, total=total, desc=desc, leave=leave, position=position, initial=initial, dynamic_ncols=True,
                disable=not enabled)


def verdict_progress(items: Iterable, desc: str):
    """The feedback core's progress display (``FeedbackContext.progress``): a tqdm bar on the second line."""
    return progress(items, desc=desc, position=1)
