"""Atomic per-player checkpoint directories and RNG state capture: a checkpoint is written under
``<parent>/.<name>.tmp-<pid>`` and renamed into place when complete (an older one of that name moved aside, then
removed); ranks that each write a part of it share rank 0's temporary directory.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from unifiedplayers.distributed import SINGLE, DistContext


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and every CUDA device) generator states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, dist: DistContext = SINGLE) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` when the block exits without error. With ``dist`` every rank
    enters, all get the same directory, and it is renamed after all have left."""
    final = Path(path)
    tmp = final.parent / dist.broadcast(f".{final.name}.tmp-{os.getpid()}")
    if dist.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    try:
        yield tmp
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    if not dist.is_main:
        return
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
