"""Shared by the data-parallel tests: a two-rank torchrun of a worker script, and weight comparison."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional

import torch

from unifiedplayers.distributed import without_rendezvous

# A worker's PYTHONPATH: the package's source, and the repository, from which it imports tests.* by name.
SRC = os.pathsep.join([str(Path(__file__).parents[2] / "src"), str(Path(__file__).parents[2])])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A rank killed by a signal before the worker's own code failed: seen once in the full suite (two xdist workers,
# launches running side by side): "terminate called without an active exception", SIGABRT 4 s after start; the
# same test passed 5 times alone and beside two busy cores. One suspect, not proven: the port free_port() picks can
# be taken by another launch before torchrun binds it. Such a launch is retried once, on a new port.
LAUNCH_CRASH = ("Signal 6 (SIGABRT)", "terminate called without an active exception", "Address already in use",
                "EADDRINUSE")


def torchrun(worker: Path, *args: str, env: Optional[Mapping[str, str]] = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 worker args...`` on a free port, one thread per rank; fails the test with
    the ranks' output when it fails, else returns the finished process (its output as text). Rendezvous
    variables this process may have set for itself (a DeepSpeed test of one rank) are not passed on. A launch
    whose rank died by a signal or lost its port (:data:`LAUNCH_CRASH`, and no Python traceback of the worker's)
    is tried once more."""
    full = without_rendezvous({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, **(env or {})})
    for attempt in (1, 2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(worker), *args]
        out = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
        text = out.stdout + out.stderr
        crashed = any(m in text for m in LAUNCH_CRASH) and f'File "{worker}"' not in text
        if out.returncode == 0 or attempt == 2 or not crashed:
            break
        print(f"[launch] {worker.name}: a rank died by a signal or lost its port; trying once more", file=sys.stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a torchrun launch and every rank under it at once, as ``kill -9`` of a job does (a cluster's scheduler
    kills the job's whole cgroup). Killing the launcher's process group is not enough: torchrun starts each rank in a
    session of its own, and the ranks would run on to the end."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def same(a: dict, b: dict) -> bool:
    """Bit-identical state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
