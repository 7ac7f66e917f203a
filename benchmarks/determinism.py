"""Does one seed give one run under load? Two training runs of one seed, started at the same time beside a
neighbour process that keeps one core busy; prints the first record or metric in which they differ, or
"identical", per dtype.

    python -m benchmarks.determinism                          # SmolLM2 smoke runs, float32 and (native bf16 only) bf16
    python -m benchmarks.determinism --dtypes float32 --preset tiny   # the tiny random model: seconds, not minutes
    python -m benchmarks.determinism --no-neighbour               # the same, without the busy core
    python -m benchmarks.determinism -- schedule.planning_updates=1   # extra overrides after --

Records (text, verdicts, rewards) and metrics are compared whole, but for ``timing/*`` and ``perf/*`` keys.
bf16 is left out where the CPU multiplies it only in emulation (it would be slow, and ``auto`` never picks it
there). The machine and its load average are printed beside the verdict; both runs use one torch thread.
First it checks whether the matmul kernels depend on memory alignment or the thread count (:func:`kernel_checks`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


SHAPES = ((64, 576, 576), (300, 576, 1536), (7, 576, 49152), (1, 576, 576))  # SmolLM2's projections and LM head


def kernel_checks(offsets: int = 15) -> list[str]:
    """Do the matmul kernels give other bits for the same values at another memory alignment, or with another
    thread count? One line per dtype: how many of ``offsets`` misaligned copies, and of the 2-thread products,
    differ from the aligned 1-thread product over :data:`SHAPES` (MKL's conditional numerical reproducibility
    exists because some kernels do)."""
    import torch

    before = torch.get_num_threads()
    lines = []
    gen = torch.Generator().manual_seed(0)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            misaligned = threads = 0
            for m, k, n in SHAPES:
                torch.set_num_threads(1)
                a, w = torch.randn(m, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype)
                ref = torch.nn.functional.linear(a, w)
                for off in range(1, offsets + 1):
                    buf = torch.empty(m * k + off, dtype=dtype)
                    shifted = buf[off:].view(m, k)
                    shifted.copy_(a)
                    misaligned += not torch.equal(torch.nn.functional.linear(shifted, w), ref)
                torch.set_num_threads(2)
                threads += not torch.equal(torch.nn.functional.linear(a, w), ref)
            lines.append(f"{str(dtype).removeprefix('torch.')}: {misaligned} of {offsets * len(SHAPES)} misaligned "
                         f"products differ from the aligned one; {threads} of {len(SHAPES)} differ with 2 threads")
    finally:
        torch.set_num_threads(before)
    return lines


def machine() -> str:
    try:
        from unifiedplayers.machine import machine_info, machine_line
    except ImportError:  # a checkout from before the module (to measure an older commit with this script)
        import platform

        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return machine_line(machine_info())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smoke", help="experiment= preset (default: smoke, SmolLM2-135M)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--no-neighbour", action="store_true", help="no busy neighbour process")
    parser.add_argument("--keep", default=None, help="keep the run directories under this folder")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (after --)")
    args = parser.parse_args(argv)

    from unifiedplayers.precision import native_bf16

    native, why = native_bf16("cpu")
    print(f"machine: {machine()}")
    print(f"preset {args.preset}, seed {args.seed}, two runs at once, one torch thread each, "
          f"{'no neighbour' if args.no_neighbour else 'a neighbour process busy on one core'}; "
          f"load average before {os.getloadavg()[0]:.2f}")
    for line in kernel_checks():
        print(f"kernels, {line}")
    status = 0
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        if dtype == "bfloat16" and not native:
            print(f"{dtype}: skipped ({why})")
            continue
        overrides = [f"experiment={args.preset}", f"seed={args.seed}", f"model.dtype={dtype}",
                     f"trainer.dtype={dtype}", "trainer.num_threads=1", *args.overrides]
        root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="determinism-"))
        workdir = root / dtype
        workdir.mkdir(parents=True, exist_ok=True)
        got = run_pair(overrides, workdir, neighbour=not args.no_neighbour)
        print(f"{dtype}: {got['verdict']}  ({got['wall_s']:.0f} s for the pair, load average {got['load']:.2f})")
        status |= got["verdict"] != "identical"
    return status


if __name__ == "__main__":
    sys.exit(main())
