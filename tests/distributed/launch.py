"""Shared by the data-parallel tests: a two-rank torchrun of a worker script, and weight comparison."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional

import torch

from unifiedplayers.distributed import without_rendezvous

SRC = str(Path(__file__).parents[2] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(worker: Path, *args: str, env: Optional[Mapping[str, str]] = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 worker args...`` on a free port, one thread per rank; fails the test with
    the ranks' output when it fails, else returns the finished process (its output as text). Rendezvous
    variables this process may have set for itself (a DeepSpeed test of one rank) are not passed on."""
    full = without_rendezvous({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, **(env or {})})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(worker), *args]
    out = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def same(a: dict, b: dict) -> bool:
    """Bit-identical state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
