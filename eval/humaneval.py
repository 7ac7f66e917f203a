"""HumanEval unit-test execution in the project's sandbox (Appendix G.2: "running the produced code against
the held-out unit tests").

A program passes only when HumanEval's ``check(entry_point)`` *returns* (eval/README.md): the source is
``solution + test`` and a grading function that calls ``check`` and then returns its argument, a random nonce
that the sandbox passes in (``Sandbox.call_many``), so an exit status 0 from ``sys.exit`` or ``os._exit`` fails.
Code that introspects the interpreter to find the nonce is out of scope (this is no sandbox escape guard). The
source runs as module ``__sandbox__``, so a completion's ``if __name__ == "__main__":`` block does not run.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Optional, Sequence

from unifiedplayers.data.benchmarks import Problem

GRADER = "__unifiedplayers_humaneval_grade__"


@dataclass
class TestOutcome:
    passed: bool
    exit_code: Optional[int]  # 0 when the grading call returned; None when it did not
    timed_out: bool
    detail: str  # why it failed: the call's error and the tail of stderr, or "timed out"


def graded_source(solution: str, test: str, entry_point: str) -> str:
    """The source whose grading function runs HumanEval's ``check`` on ``solution`` and then returns
    the nonce it was given (the sentinel: reached only when ``check`` returned)."""
    return (f"{solution}\n\n{test}\n\n"
            f"def {GRADER}(nonce):\n"
            f"    check({entry_point})\n"
            f"    return nonce\n")


def run_unit_tests(sandbox, problems: Sequence[Problem], solutions: Sequence[Optional[str]],
                   timeout_s: Optional[float] = None) -> list[TestOutcome]:
    """Run each solution against its problem's unit tests in ``sandbox`` (one ``call_many`` batch)."""
    if len(problems) != len(solutions):
        raise ValueError(f"{len(problems)} problems but {len(solutions)} solutions")
    nonces = [secrets.token_hex(16) for _ in problems]
    items = [(graded_source(sol or "", p.meta["test"], p.meta["entry_point"]), GRADER, nonce)
             for p, sol, nonce in zip(problems, solutions, nonces)]
    results = sandbox.call_many(items, timeout_s=timeout_s)
    outcomes = []
    for r, nonce in zip(results, nonces):
        returned = bool(r.ok) and r.value == nonce
        passed = returned and not r.timed_out and not r.memory_exceeded
        if r.timed_out:
            detail = "timed out"
        elif passed:
            detail = ""
        elif r.ok:  # returned, but not the nonce: the grading function was replaced or bypassed
            detail = f"the tests did not return the sentinel (got {str(r.value)[:60]!r})"
        else:
            detail = " | ".join(x for x in ((r.error or "").strip()[-200:], (r.stderr or "").strip()[-300:]) if x)
        outcomes.append(TestOutcome(passed=passed, exit_code=0 if returned else None, timed_out=bool(r.timed_out),
                                    detail=detail))
    return outcomes
