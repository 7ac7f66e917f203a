"""Does one seed give one run? :func:`run_pair` starts two training runs of one seed together, beside a process
that keeps a core busy, and :func:`first_difference` names the first record or metric in which two run directories
differ (``timing/*`` and ``perf/*`` aside)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

IGNORED_PREFIXES = ("timing/", "perf/")
FILES = ("records.jsonl", "metrics.jsonl")


def _lines(path: Path) -> list:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            if isinstance(item, dict):
                item = {k: v for k, v in item.items() if not k.startswith(IGNORED_PREFIXES)}
            out.append(item)
    return out


def _first_diff(a, b, path: str) -> Optional[str]:
    """Where ``a`` and ``b`` first differ (depth first, keys in order), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: only in the {'second' if key not in a else 'first'} run"
            found = _first_diff(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_diff(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else f"{path}: {len(a)} items against {len(b)}"
    if type(a) is not type(b) or a != b:
        return f"{path}: {str(a)[:160]!r} against {str(b)[:160]!r}"
    return None


def first_difference(run_a: Path, run_b: Path) -> Optional[str]:
    """The first record or metric in which two run directories differ (``timing/*``, ``perf/*`` left out), or None.
    A run that wrote no records is a difference too (a failed run is never "identical")."""
    for name in FILES:
        a, b = _lines(Path(run_a) / name), _lines(Path(run_b) / name)
        if not a and not b:
            return f"{name}: neither run wrote any"
        found = _first_diff(a, b, name.removesuffix(".jsonl"))
        if found:
            return found
    return None


def start_neighbour(niceness: int = 0) -> subprocess.Popen:
    """A process that keeps one core busy until it is killed; ``niceness`` > 0: it takes only what nothing else
    wants of the core (beside other work, as in the test suite, the core is busy either way)."""
    return subprocess.Popen([sys.executable, "-c", "while True:\n    pass"],
                            preexec_fn=(lambda: os.nice(niceness)) if niceness else None)


def run_pair(overrides: Sequence[str], workdir: Path, neighbour: bool = True, timeout_s: float = 3600,
             niceness: int = 0) -> dict:
    """Two runs of ``overrides`` started together (each ``run_dir=workdir/{a,b}``, one torch thread), beside a
    busy neighbour when ``neighbour`` (of that ``niceness``); returns the verdict, the wall time and the load
    average."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    busy = start_neighbour(niceness) if neighbour else None
    t0 = time.monotonic()
    procs = {}
    try:
        for name in ("a", "b"):
            log = open(workdir / f"{name}.log", "w")
            cmd = [sys.executable, "-m", "unifiedplayers.train", *overrides, f"run_dir={workdir / name}",
                   "resume=false", "schedule.print_summary=false"]
            procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
        codes = {}
        for name, (proc, log) in procs.items():
            try:
                codes[name] = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
            log.close()
        load = os.getloadavg()[0]
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
        if busy is not None:
            busy.kill()
            busy.wait()
    failed = {n: c for n, c in codes.items() if c != 0}
    verdict = (f"a run failed (exit {failed}; logs in {workdir})" if failed
               else first_difference(workdir / "a", workdir / "b") or "identical")
    return {"verdict": verdict, "wall_s": time.monotonic() - t0, "load": load}
