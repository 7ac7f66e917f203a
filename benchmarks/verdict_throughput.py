"""Verdict throughput: the feedback of one task through the warm sandbox vs one fresh python3 per check.

One task = K=8 Execution trajectories (Appendix I.2's divisor-counting task, some right, some wrong),
M=4 realistic verifiers (Appendix I.3 style) and P=5 perturbation rules: the K arg_mutation
re-executions plus K·M·(1+P) = 192 checks. Timed end to end: ``PerturbationEngine.perturb_many`` and
``verdict_matrix``. The baseline does the same work (same programs, same payloads) with one fresh
``python3`` process per re-execution and per check, run over as many threads as the sandbox has
workers, and must reach the same verdict matrix.

    python -m benchmarks.verdict_throughput [--tasks 5] [--baseline-tasks 1]

Target (benchmarks/README.md, "Measured figures"): <= 0.5 s per task on 2 cores and >= 20x faster than the baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.sandbox import Sandbox, SandboxConfig, naive_run
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step
from unifiedplayers.feedback.verdict import verdict_matrix
from unifiedplayers.feedback.verifier import ENTRY_POINT, compile_verifier, sandbox_source

QUESTION = "How many positive whole-number divisors does 196 have?"

VERIFIERS = [
    # brute-force re-count (Verifier 1.1)
    '''```python
def check(trajectory):
    expected = sum(1 for d in range(1, 197) if 196 % d == 0)
    try:
        ans = int(str(trajectory.final_answer).strip())
    except ValueError:
        return False, len(trajectory.steps)
    if ans != expected:
        return False, len(trajectory.steps)
    return True, None
```''',
    # code-output cross-check (Verifier 1.2), with the failing step
    '''```python
def check(trajectory):
    outs = [(i, s.result) for i, s in enumerate(trajectory.steps) if s.type == "output"]
    if not outs:
        return False, 0
    i, last = outs[-1]
    if str(last).strip() != str(trajectory.final_answer).strip():
        return False, i
    return True, None
```''',
    # prime factorisation (Verifier 1.3) and tool sanity: every code step is python and has an output
    '''```python
def check(trajectory):
    steps = trajectory.steps
    for i, s in enumerate(steps):
        if s.type == "code":
            if s.lang != "python":
                return False, i
            if i + 1 >= len(steps) or steps[i + 1].type != "output":
                return False, i
    n, count, p = 196, 1, 2
    while p * p <= n:
        e = 0
        while n % p == 0:
            n //= p
            e += 1
        count *= e + 1
        p += 1
    if n > 1:
        count *= 2
    try:
        return int(trajectory.final_answer) == count, None
    except (TypeError, ValueError):
        return False, len(steps)
```''',
    # structure: reasoning before code, code reproduces the count, answer matches the reasoning
    '''```python
import re

def check(trajectory):
    steps = trajectory.steps
    kinds = [s.type for s in steps]
    if "reason" not in kinds or "code" not in kinds or kinds.index("reason") > kinds.index("code"):
        return False, 0
    code = next(s.code for s in steps if s.type == "code")
    if "196" not in code:
        return False, kinds.index("code")
    claimed = re.findall(r"-?\\d+", " ".join(s.text for s in steps if s.type == "reason"))
    answer = str(trajectory.final_answer).strip()
    if not claimed or claimed[-1] != answer:
        return False, kinds.index("reason")
    return answer == "9", None
```''',
]


def trajectories() -> list[Trajectory]:
    """K = 8 trajectories: six right (various code), two wrong (answer 8 from a buggy count)."""
    right = [
        ("count = sum(1 for d in range(1, 197) if 196 % d == 0)\nprint(count)", "9"),
        ("print(len([d for d in range(1, 197) if 196 % d == 0]))", "9"),
        ("c = 0\nfor d in range(1, 197):\n    if 196 % d == 0:\n        c += 1\nprint(c)", "9"),
        ("print((2 + 1) * (2 + 1))", "9"),
        ("import math\nprint(sum(2 if d * d != 196 else 1 for d in range(1, math.isqrt(196) + 1) if 196 % d == 0))",
         "9"),
        ("divs = [d for d in range(1, 197) if 196 % d == 0]\nprint(len(divs))", "9"),
    ]
    wrong = [
        ("print(sum(1 for d in range(1, 196) if 196 % d == 0))", "8"),
        ("print(len([d for d in range(2, 197) if 196 % d == 0]))", "8"),
    ]
    out = []
    for code, result in right + wrong:
        out.append(Trajectory(QUESTION, [
            reason_step(f"196 = 2^2 * 7^2, so I count its divisors with code; I expect {result}."),
            code_step(code),
            output_step(result),
            reason_step(f"The code prints {result}, so there are {result} divisors."),
        ], result))
    return out


def one_task(sb, seed: int, split: list | None = None):
    t0 = time.perf_counter()
    trajs = trajectories()
    engine = PerturbationEngine(seed=seed, sandbox=sb)
    variants = engine.perturb_many(trajs)
    t1 = time.perf_counter()
    vm = verdict_matrix(VERIFIERS, trajs, variants, sb)
    if split is not None:
        split.append((t1 - t0, time.perf_counter() - t1))
    return trajs, variants, vm


class InstantSandbox:
    """Answers every call at once: what the feedback core itself costs per task, without execution."""

    def run_many(self, codes):
        from unifiedplayers.sandbox import ExecResult

        return [ExecResult("9\n", "", 0) for _ in codes]

    def call_many(self, items):
        from unifiedplayers.sandbox import CallResult

        items = list(items)
        for _, _, payload in items:
            json.dumps(payload)  # the serialisation a real call pays for
        return [CallResult(True, {"accepted": True, "returned": "bool", "repr": "True", "fail_step": None})
                for _ in items]


def naive_task(trajs, variants_template, seed: int, workers: int):
    """The same work with one fresh python3 process per re-execution and per check."""

    class NaiveSandbox:
        def run_many(self, codes):
            with ThreadPoolExecutor(workers) as ex:
                return list(ex.map(naive_run, codes))

    engine = PerturbationEngine(seed=seed, sandbox=NaiveSandbox())
    variants = engine.perturb_many(trajs)
    # Same mutations (tracebacks name different files, so compare the code, not the observations).
    codes = [[None if v is None else [s.code for s in v.steps] for v in row] for row in variants]
    assert codes == [[None if v is None else [s.code for s in v.steps] for v in row] for row in variants_template]
    compiled = [compile_verifier(v) for v in VERIFIERS]
    valid = [i for i, c in enumerate(compiled) if c.valid]
    jobs, where = [], []
    for row, i in enumerate(valid):
        program = sandbox_source(compiled[i].source)
        for k, t in enumerate(trajs):
            for j, traj in [(None, t)] + [(j, v) for j, v in enumerate(variants[k]) if v is not None]:
                payload = json.dumps(traj.to_dict())
                jobs.append(program + f"\nimport json as _j\nprint(_j.dumps({ENTRY_POINT}(_j.loads({payload!r}))))\n")
                where.append((row, k, j))
    with ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(naive_run, jobs))
    p = len(engine.rules)
    z_orig = np.zeros((len(valid), len(trajs)), dtype=np.int8)
    z_adv = np.zeros((len(valid), len(trajs), p), dtype=np.int8)
    for (row, k, j), r in zip(where, results):
        value = json.loads(r.stdout) if r.exit_code == 0 and r.stdout.strip() else None
        accepted = isinstance(value, dict) and value.get("accepted") is True
        if j is None:
            z_orig[row, k] = accepted
        else:
            z_adv[row, k, j] = accepted
    return z_orig, z_adv, len(jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--baseline-tasks", type=int, default=1)
    args = ap.parse_args()

    with Sandbox(SandboxConfig(timeout_s=10, memory_mb=512)) as sb:
        workers = int(sb.isolation.get("workers") or os.cpu_count() or 1)
        one_task(sb, seed=-1)  # warm-up: server start and the first fork
        times, split = [], []
        for t in range(args.tasks):
            t0 = time.perf_counter()
            trajs, variants, vm = one_task(sb, seed=t, split=split)
            times.append(time.perf_counter() - t0)
        n_checks = len(vm.checks)
        arg = list(PerturbationEngine(seed=0, sandbox=sb).rules).index("arg_mutation")
        n_reexec = sum(row[arg] is not None for row in variants)
        assert vm.errors == [], [c.outcome.reason for c in vm.errors][:3]

    base = {}  # baseline workers -> seconds per task
    for w in sorted({workers, 1}, reverse=True):
        base_times = []
        for t in range(args.baseline_tasks):
            t0 = time.perf_counter()
            z_orig, z_adv, n_jobs = naive_task(trajs, variants, seed=args.tasks - 1, workers=w)
            base_times.append(time.perf_counter() - t0)
            assert np.array_equal(z_orig, vm.z_orig) and np.array_equal(z_adv, vm.z_adv), "baseline verdicts differ"
        base[w] = float(np.mean(base_times))

    t0 = time.perf_counter()
    for t in range(20):
        one_task(InstantSandbox(), seed=t)
    s_core = (time.perf_counter() - t0) / 20

    s_task = float(np.mean(times))
    s_perturb, s_verdict = np.mean(split, axis=0)
    print(f"task: K=8 trajectories, M=4 verifiers (M_q={len(vm.valid)}), P=5 rules; "
          f"{n_checks} checks + {n_reexec} arg_mutation re-executions; {workers} workers")
    print(f"verdict matrix Z(q): {vm.z.shape}, original acceptance {vm.z_orig.mean():.3f}, "
          f"adversarial rejection {1 - vm.z_adv[:, vm.adv_mask].mean():.3f}")
    print(f"warm sandbox:          {s_task:.3f} s/task  (min {min(times):.3f}, max {max(times):.3f}, "
          f"{args.tasks} tasks; {n_checks / s_task:.0f} checks/s)")
    print(f"  of which perturbation + re-executions {s_perturb:.3f} s, verdict batch {s_verdict:.3f} s; "
          f"feedback core without execution {s_core * 1000:.1f} ms")
    lat = sorted(c.outcome.duration_s for c in vm.checks)
    print(f"  sandbox-reported check latency p50 {1e3 * lat[len(lat) // 2]:.1f} ms, "
          f"p99 {1e3 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms; load average {os.getloadavg()[0]:.1f}")
    for w, s_base in base.items():
        print(f"fresh python3 / check, {w} at a time: {s_base:.3f} s/task  ({args.baseline_tasks} task(s), "
              f"{n_jobs} checks + {n_reexec} re-executions) -> speed-up {s_base / s_task:.1f}x")
    print("targets: <= 0.5 s/task, >= 20x")


if __name__ == "__main__":
    main()
