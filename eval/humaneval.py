"""HumanEval unit-test execution in the project's sandbox (SPEC §9: "run against its unit tests").

Each program is ``solution + test + check(entry_point)``, run as its own sandboxed process with the
sandbox's timeout and memory cap; it passes when it exits 0 within the limits. Programs are sent in
one ``run_many`` batch, so the sandbox runs them in parallel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from eval.benchmarks import Problem


@dataclass
class TestOutcome:
    passed: bool
    exit_code: Optional[int]
    timed_out: bool
    detail: str  # the tail of stderr, or "timed out"


def test_program(solution: str, test: str, entry_point: str) -> str:
    """The program that runs HumanEval's ``check`` against ``solution``."""
    return f"{solution}\n\n{test}\n\ncheck({entry_point})\n"


def run_unit_tests(sandbox, problems: Sequence[Problem], solutions: Sequence[str],
                   timeout_s: Optional[float] = None) -> list[TestOutcome]:
    """Run each solution against its problem's unit tests in ``sandbox`` (one ``run_many`` batch)."""
    if len(problems) != len(solutions):
        raise ValueError(f"{len(problems)} problems but {len(solutions)} solutions")
    programs = [test_program(sol, p.meta["test"], p.meta["entry_point"]) for p, sol in zip(problems, solutions)]
    results = sandbox.run_many(programs, timeout_s=timeout_s)
    outcomes = []
    for r in results:
        passed = r.exit_code == 0 and not r.timed_out and not r.memory_exceeded
        detail = "timed out" if r.timed_out else (r.stderr or getattr(r, "error", "") or "").strip()[-300:]
        outcomes.append(TestOutcome(passed=passed, exit_code=r.exit_code, timed_out=r.timed_out, detail=detail))
    return outcomes
