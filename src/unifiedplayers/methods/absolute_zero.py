"""Absolute Zero (SPEC §11; ``paper/absolute_zero_*.txt``): one model proposes and solves code-reasoning
tasks; the proposed programs are validated and answered by executing them in *our* sandbox.

A proposal is a Python program defining ``f`` and an input (a Python literal). It is valid when the
program parses, defines ``f``, imports nothing that makes it nondeterministic (``random``, ``time``, ...),
and running ``f(input)`` twice in the sandbox exits cleanly with the same printed ``repr`` both times
(``validate_proposal``; AZR's determinism check). The task types (AZR §3.2):

- deduction: given ``f`` and the input, predict the output — correct when it equals the executed output;
- abduction: given ``f`` and the output, predict an input — correct when ``f(predicted)`` gives the output;
- induction: given input/output pairs, write ``f`` — correct when it reproduces every pair.

Rewards (AZR Eq. 4-5): the proposer's learnability reward r_propose = 1 − r̄_solve when 0 < r̄_solve < 1,
else 0 (a task every sample solves, or none does, teaches nothing); the solver's reward is binary
correctness. On the engine these are the ``learnability`` (Planning role) and ``expected_answer``
(Execution role) reward sources: the expected answer of a task is the one the sandbox computed, never
the proposer's claim, and comparisons parse both sides as Python literals when they can.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.methods import TaskFeedback, register_reward_source

TASK_TYPES = ("deduction", "abduction", "induction")
# Modules whose use makes a program's output depend on more than its input.
NONDETERMINISTIC_MODULES = frozenset({"random", "time", "datetime", "os", "sys", "secrets", "uuid", "threading",
                                      "multiprocessing", "subprocess", "socket", "numpy", "gc", "inspect"})


@dataclass
class ProposalCheck:
    valid: bool
    output: Optional[str] = None  # repr of f(input), as printed in the sandbox
    reason: str = ""


def static_check(program: str) -> Optional[str]:
    """Why ``program`` cannot be a task (None when it can): syntax, no ``f``, a nondeterministic import."""
    try:
        tree = ast.parse(program)
    except SyntaxError as exc:
        return f"syntax error: {exc.msg} (line {exc.lineno})"
    if not any(isinstance(n, ast.FunctionDef) and n.name == "f" for n in tree.body):
        return "no top-level function f"
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        bad = sorted({n.split(".")[0] for n in names} & NONDETERMINISTIC_MODULES)
        if bad:
            return f"imports {', '.join(bad)} (nondeterministic)"
    return None


def _call_code(program: str, input_literal: str) -> str:
    return f"{program}\n\nprint(repr(f({input_literal})))\n"


def literal_or_text(s: Optional[str]) -> Any:
    """A Python literal when ``s`` parses as one, else the stripped text (None stays None)."""
    if s is None:
        return None
    s = str(s).strip()
    try:
        return ("lit", ast.literal_eval(s))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ("text", s)


def outputs_equal(a: Optional[str], b: Optional[str]) -> bool:
    """Equal as Python literals (``[1, 2]`` == ``[1,2]``, ``'a'`` == ``"a"``), else as stripped text."""
    if a is None or b is None:
        return False
    return literal_or_text(a) == literal_or_text(b)


def validate_proposal(sandbox: Any, program: str, input_literal: str) -> ProposalCheck:
    """Run ``f(input)`` twice in the sandbox; valid when both runs succeed and print the same repr."""
    why = static_check(program)
    if why:
        return ProposalCheck(False, reason=why)
    kind, _ = literal_or_text(input_literal)
    if kind != "lit":
        return ProposalCheck(False, reason=f"input is not a Python literal: {input_literal[:80]!r}")
    code = _call_code(program, input_literal)
    runs = sandbox.run_many([code, code])
    for r in runs:
        if r.timed_out or r.exit_code != 0:
            detail = "timed out" if r.timed_out else (r.stderr.strip().splitlines() or ["exit %d" % r.exit_code])[-1]
            return ProposalCheck(False, reason=f"execution failed: {detail[:200]}")
    if runs[0].stdout != runs[1].stdout:
        return ProposalCheck(False, reason="nondeterministic: two runs printed different outputs")
    return ProposalCheck(True, output=runs[0].stdout.strip())


def check_deduction(expected_output: str, predicted_output: Optional[str]) -> bool:
    return outputs_equal(expected_output, predicted_output)


def check_abduction(sandbox: Any, program: str, predicted_input: Optional[str], expected_output: str) -> bool:
    """Correct when ``f(predicted_input)`` prints the expected output (any input that does counts)."""
    if predicted_input is None:
        return False
    got = validate_proposal(sandbox, program, predicted_input)
    return got.valid and outputs_equal(got.output, expected_output)


def check_induction(sandbox: Any, predicted_program: Optional[str], pairs: Sequence[tuple[str, str]]) -> bool:
    """Correct when the predicted ``f`` reproduces every (input, output) pair."""
    if not predicted_program or not pairs:
        return False
    for inp, out in pairs:
        got = validate_proposal(sandbox, predicted_program, inp)
        if not (got.valid and outputs_equal(got.output, out)):
            return False
    return True


def learnability_reward(solve_rate: float) -> float:
    """AZR Eq. 4: r_propose = 1 − r̄_solve if 0 < r̄_solve < 1, else 0."""
    if not 0.0 <= solve_rate <= 1.0:
        raise ValueError(f"solve rate {solve_rate} outside [0, 1]")
    return 0.0 if solve_rate in (0.0, 1.0) else 1.0 - solve_rate


def solve_flags(answers: Sequence[Optional[str]], expected: Optional[str]) -> np.ndarray:
    """1 where a sample's answer equals the expected answer, else 0. Shape (K,)."""
    return np.array([float(outputs_equal(a, expected)) for a in answers], dtype=np.float64)


@register_reward_source("execution", "expected_answer")
def execution_expected_answer(fb: TaskFeedback) -> np.ndarray:
    """Binary correctness against the task's trusted expected answer (AZR Eq. 5). Shape (K,)."""
    if fb.expected_answer is None:
        raise ValueError("expected_answer reward: the task carries no expected answer")
    return solve_flags(fb.answers, fb.expected_answer)


@register_reward_source("planning", "learnability")
def planning_learnability(fb: TaskFeedback) -> float:
    """AZR Eq. 4 over the K solver samples of the task."""
    if fb.expected_answer is None or not len(fb.answers):
        return 0.0
    return learnability_reward(float(solve_flags(fb.answers, fb.expected_answer).mean()))
