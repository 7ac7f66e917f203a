"""Sandbox throughput: 192 verifier-like calls through the warm sandbox vs one fresh python3 per call.

Each call parses a JSON trajectory, recomputes a small arithmetic answer and compares it with the
trajectory's final answer, like the verifiers of the paper's Appendix I.3. Prints calls/s for both,
their ratio, and p50/p99 latency. Target (benchmarks/README.md, "Measured figures"): ratio >= 20x on 2 cores.

    python -m benchmarks.sandbox_throughput [--calls 192] [--baseline-calls 48] [--as-user UID]

``--as-user UID`` (run as root) measures the sandbox of a user who is not root, through user namespaces: the
benchmark runs again as that uid, under ``setpriv``, with the system's ``python3`` (a uid of no one cannot run an
interpreter under root's home) and the checkout's ``src/`` on its path; the sandbox imports only the standard library.
Compare it with a root run of the same interpreter: ``PYTHONPATH=src:. /usr/bin/python3 -m
benchmarks.sandbox_throughput``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from unifiedplayers.sandbox import Sandbox, SandboxConfig, naive_run

VERIFIER = '''
import json, re
from fractions import Fraction

def check(payload):
    traj = json.loads(payload["trajectory"])
    outputs = [s["result"] for s in traj["steps"] if s["type"] == "output"]
    nums = [Fraction(x) for x in re.findall(r"-?\\d+(?:\\.\\d+)?", traj["question"])]
    expected = nums[0] * nums[1] - nums[2]
    answer = traj["final_answer"]
    if answer is None:
        return (False, len(traj["steps"]))
    ok = Fraction(answer) == expected and any(str(expected) in o for o in outputs)
    return (ok, None if ok else len(traj["steps"]) - 1)
'''


def trajectory(i: int) -> str:
    a, b, c = 3 + i % 7, 4 + i % 5, i % 11
    ans = a * b - c if i % 4 else a * b - c + 1  # every fourth one is wrong
    return json.dumps({
        "question": f"A shop sells {a} boxes of {b} apples and gives away {c}. How many are left?",
        "steps": [
            {"type": "reason", "text": "Multiply, then subtract."},
            {"type": "code", "code": f"print({a}*{b}-{c})", "lang": "python"},
            {"type": "output", "result": f"{a * b - c}\n"},
        ],
        "final_answer": str(ans),
    })


def _cpu() -> float:
    """CPU seconds of this process and of its reaped descendants."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def as_user(uid: int, argv: list[str], python: str = "/usr/bin/python3") -> int:
    """This benchmark again, as ``uid`` (from root), with ``python`` and the checkout's ``src/`` on its path."""
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{root / 'src'}:{root}", "HOME": "/"}
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-m",
               "benchmarks.sandbox_throughput", *argv]
    return subprocess.run(command, env=env, cwd="/").returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=192)
    ap.add_argument("--baseline-calls", type=int, default=48, help="fresh-process calls timed (rate is per call)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--as-user", type=int, default=None, metavar="UID",
                    help="run as this uid (from root): the sandbox of a user who is not root")
    args = ap.parse_args()
    if args.as_user is not None:
        sys.exit(as_user(args.as_user, ["--calls", str(args.calls), "--baseline-calls", str(args.baseline_calls),
                                        "--repeats", str(args.repeats)]))

    items = [(VERIFIER, "check", {"trajectory": trajectory(i)}) for i in range(args.calls)]
    # CPU time as well as wall time: on a shared machine the wall clock measures the neighbours too.
    # Everything the sandbox runs (server, slot workers, calls) is a reaped descendant of this process
    # once the sandbox is closed, so RUSAGE_CHILDREN covers it.
    cpu0 = _cpu()
    with Sandbox(SandboxConfig(timeout_s=10, memory_mb=512)) as sb:
        sb.call_many(items[:4])  # warm-up
        walls, lat = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = sb.call_many(items)
            walls.append(time.perf_counter() - t0)
            lat += [r.duration_s for r in res]
        verdicts = [bool(r.value and r.value[0]) for r in res]
        assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
        assert verdicts == [i % 4 != 0 for i in range(args.calls)]
        iso = sb.isolation
    sandbox_cpu = (_cpu() - cpu0) / (args.calls * args.repeats + 4)
    wall = statistics.median(walls)
    sandbox_rate = args.calls / wall

    # Baseline: the same function and payloads, one fresh interpreter per call.
    base_lat = []
    cpu0 = _cpu()
    t0 = time.perf_counter()
    for name, fn, payload in items[: args.baseline_calls]:
        code = f"{VERIFIER}\nimport json\nprint(json.dumps({fn}({payload!r})))"
        r = naive_run(code)
        assert r.exit_code == 0, r.stderr
        base_lat.append(r.duration_s)
    base_wall = time.perf_counter() - t0
    base_cpu = (_cpu() - cpu0) / args.baseline_calls
    base_rate = args.baseline_calls / base_wall

    layers = [layer for layer in ("netns", "uid", "pidns", "landlock", "tmpfs") if iso.get(layer)]
    print(f"machine: {os.cpu_count()} cores; uid {os.geteuid()}, {sys.executable}; isolation: "
          f"{iso.get('mechanism', 'root')}, {' '.join(layers)}; workers={iso['workers']}")
    print(f"sandbox : {args.calls} calls in {wall:.3f} s (median of {args.repeats}) = {sandbox_rate:8.1f} calls/s; "
          f"latency p50 {1e3 * percentile(lat, 0.5):.2f} ms, p99 {1e3 * percentile(lat, 0.99):.2f} ms")
    print(f"baseline: {args.baseline_calls} fresh python3 processes in {base_wall:.3f} s = {base_rate:8.1f} calls/s; "
          f"latency p50 {1e3 * percentile(base_lat, 0.5):.2f} ms, p99 {1e3 * percentile(base_lat, 0.99):.2f} ms")
    print(f"ratio   : {sandbox_rate / base_rate:.1f}x (target >= 20x); 1-min load average {os.getloadavg()[0]:.1f}")
    cores = os.cpu_count() or 1
    print(f"cpu     : sandbox {1e3 * sandbox_cpu:.2f} ms of CPU per call (all processes, start-up included), "
          f"baseline {1e3 * base_cpu:.2f} ms; CPU-bound rates on {cores} idle cores: sandbox "
          f"{cores / sandbox_cpu:.0f} calls/s vs baseline {1 / base_cpu:.0f} calls/s one at a time "
          f"= {(cores / sandbox_cpu) * base_cpu:.1f}x")


if __name__ == "__main__":
    main()
