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
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.methods import TaskFeedback, register_reward_source, register_task_builder

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
    defines_f = any((isinstance(n, ast.FunctionDef) and n.name == "f")
                    or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "f" for t in n.targets))
                    for n in tree.body)
    if not defines_f:
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


def solve_flags(answers: Sequence[Optional[str]], expected: Optional[str], check: Any = None) -> np.ndarray:
    """1 where a sample's answer is correct, else 0. Shape (K,). ``check(answer) -> bool`` when the task
    verifies answers by execution (abduction, induction), else literal equality with ``expected``."""
    if check is not None:
        return np.array([float(a is not None and bool(check(a))) for a in answers], dtype=np.float64)
    return np.array([float(outputs_equal(a, expected)) for a in answers], dtype=np.float64)


@register_reward_source("execution", "expected_answer")
def execution_expected_answer(fb: TaskFeedback) -> np.ndarray:
    """Binary correctness against the task's trusted answer (AZR Eq. 5). Shape (K,)."""
    if fb.expected_answer is None and fb.answer_check is None:
        raise ValueError("expected_answer reward: the task carries no expected answer")
    return solve_flags(fb.answers, fb.expected_answer, fb.answer_check)


@register_reward_source("planning", "learnability")
def planning_learnability(fb: TaskFeedback) -> float:
    """AZR Eq. 4 over the K solver samples of the task."""
    if (fb.expected_answer is None and fb.answer_check is None) or not len(fb.answers):
        return 0.0
    return learnability_reward(float(solve_flags(fb.answers, fb.expected_answer, fb.answer_check).mean()))


# --------------------------------------------------------------------------------------------------
# Proposals -> tasks (the ``code_reasoning`` task builder; ``method.extra.task_format``)

_FENCE = re.compile(r"```(\w*)[ \t]*\n(.*?)```", re.DOTALL)

QUESTIONS = {
    "deduction": ("Here is a Python function and an input.\n```python\n{program}```\nInput: {input}\n"
                  "What does f return for this input? Give the returned value as a Python literal in \\boxed{{}}."),
    "abduction": ("Here is a Python function.\n```python\n{program}```\nFind an input x for which f(x) returns "
                  "{output}. Give x as a Python literal in \\boxed{{}}."),
    "induction": ("A hidden Python function f maps these inputs to these outputs:\n{pairs}\n"
                  "Write f as a Python lambda expression in \\boxed{{}}, e.g. \\boxed{{lambda x: x + 1}}."),
}


def parse_proposal(text: str) -> tuple[Optional[str], list[str]]:
    """(program, inputs) from a proposer output: the first ```python block and every ```input block."""
    program, inputs = None, []
    for lang, body in _FENCE.findall(text):
        if lang == "python" and program is None:
            program = body if body.endswith("\n") else body + "\n"
        elif lang == "input" and body.strip():
            inputs.append(body.strip())
    return program, inputs


def build_code_task(task: Any, sandbox: Any, max_pairs: int = 3) -> Any:
    """Turn a proposer output (``task.text``; the task type is its topic) into a validated code task:
    ``question``, ``expected_answer`` (the sandbox's output, or the input for abduction) and ``check``
    (answer -> correct?). An invalid proposal stays a malformed task with its reason."""
    from unifiedplayers.players.planning import PlanningTask

    kind = task.topic if task.topic in TASK_TYPES else "deduction"
    program, inputs = parse_proposal(task.text)

    def malformed(reason: str) -> Any:
        return PlanningTask(task.text, None, None, False, reason, task.prompt_index, task.topic, task.completion)

    if program is None:
        return malformed("no ```python block with f")
    if not inputs:
        return malformed("no ```input block")
    pairs = []
    for inp in inputs[: (max_pairs if kind == "induction" else 1)]:
        got = validate_proposal(sandbox, program, inp)
        if not got.valid:
            return malformed(f"invalid proposal: {got.reason}")
        pairs.append((inp, got.output))
    if kind == "deduction":
        question = QUESTIONS[kind].format(program=program, input=pairs[0][0])
        expected, check = pairs[0][1], (lambda a, out=pairs[0][1]: check_deduction(out, a))
    elif kind == "abduction":
        question = QUESTIONS[kind].format(program=program, output=pairs[0][1])
        expected = pairs[0][0]
        check = lambda a, prog=program, out=pairs[0][1]: check_abduction(sandbox, prog, a, out)  # noqa: E731
    else:
        question = QUESTIONS[kind].format(pairs="\n".join(f"f({i}) = {o}" for i, o in pairs))
        expected = None  # any lambda reproducing the pairs is correct

        def check(a: Optional[str], pairs=tuple(pairs)) -> bool:
            if not a or not a.strip().startswith("lambda"):
                return False
            return check_induction(sandbox, f"f = {a.strip()}\n", pairs)
    out = PlanningTask(task.text, question, expected, True, "", task.prompt_index, task.topic, task.completion)
    out.check = check
    return out


register_task_builder("code_reasoning", build_code_task)
