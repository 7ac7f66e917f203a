"""Absolute Zero (Appendix G.1; Zhao et al. 2025, arXiv 2505.03335): one model proposes and solves code-reasoning
tasks, validated and answered by executing them in our sandbox (docs/baselines.md: what is kept and what departs).

A proposal (a program defining ``f`` and inputs) is valid when it parses, imports nothing nondeterministic and
``f(input)`` prints the same ``repr`` in two sandbox runs (:func:`validate_proposal`; AZR §3.3, j = 2). Task types
(AZR §3.2): deduction (predict the output), abduction (predict an input; value equality of ``f(predicted)``),
induction (write ``f`` from half the pairs; checked on all, so a lookup table fails). The expected answer is the one
the sandbox computed, never the proposer's claim.

Rewards: AZR's composite reward (its §3.1) over the role rewards of Eq. 4-6::

    R(y) = r_role   if the response is well formatted and passable
           −0.5     if it is well formatted but not passable
           −1       if it has a format error

- proposer: r_propose = 1 − r̄_solve when 0 < r̄_solve < 1, else 0 (AZR Eq. 4); an unreadable or invalid proposal is
  a malformed task (:meth:`AbsoluteZero.malformed_task_reward`);
- solver: r_solve = binary correctness (AZR Eq. 5); no ``\boxed{}`` answer is the format error.

An :class:`AnswerCheck` is plain, picklable data, broadcast to every rank; its sandbox is bound where it was built.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from unifiedplayers.methods.base import Method, register_method
from unifiedplayers.methods.sources import register_reward_source

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
    """Run ``f(input)`` twice in the sandbox, with seeds 0 and 1 (so that a program reading the clock or a random
    source prints differently); valid when both runs succeed and print the same repr."""
    why = static_check(program)
    if why:
        return ProposalCheck(False, reason=why)
    kind, _ = literal_or_text(input_literal)
    if kind != "lit":
        return ProposalCheck(False, reason=f"input is not a Python literal: {input_literal[:80]!r}")
    code = _call_code(program, input_literal)
    runs = sandbox.run_many([code, code], seeds=[0, 1])  # two seeds: a deterministic sandbox repeats a seed
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
    runs = (validate_proposal(sandbox, predicted_program, inp) for inp, _ in pairs)  # stops at the first miss
    return all(got.valid and outputs_equal(got.output, out) for got, (_, out) in zip(runs, pairs))


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


WRONG_OR_INVALID_REWARD = -0.5
FORMAT_ERROR_REWARD = -1.0


def composite_reward(role_reward: float, well_formatted: bool, passable: bool) -> float:
    """AZR's composite reward R(y) (§3.1; the module docstring)."""
    if not well_formatted:
        return FORMAT_ERROR_REWARD
    return float(role_reward) if passable else WRONG_OR_INVALID_REWARD


@register_reward_source("execution", "expected_answer")
def execution_expected_answer(fb: TaskFeedback) -> np.ndarray:
    """Binary correctness against the task's trusted answer (AZR Eq. 5). Shape (K,)."""
    if fb.expected_answer is None and fb.answer_check is None:
        raise ValueError("expected_answer reward: the task carries no expected answer")
    return solve_flags(fb.answers, fb.expected_answer, fb.answer_check)


@register_reward_source("planning", "learnability", check=lambda m: check_shared_model(m))
def planning_learnability(fb: TaskFeedback) -> float:
    """AZR Eq. 4 over the K solver samples of the task."""
    if (fb.expected_answer is None and fb.answer_check is None) or not len(fb.answers):
        return 0.0
    return learnability_reward(float(solve_flags(fb.answers, fb.expected_answer, fb.answer_check).mean()))


@register_reward_source("planning", "azr_composite", check=lambda m: check_shared_model(m))
def planning_azr_composite(fb: TaskFeedback) -> float:
    """The proposer's composite reward of a valid (played) task (:func:`proposal_reward`)."""
    return proposal_reward(None, planning_learnability(fb))


@register_reward_source("execution", "azr_composite")
def execution_azr_composite(fb: TaskFeedback) -> np.ndarray:
    """The solver's composite reward of each of the K samples. Shape (K,)."""
    solved = execution_expected_answer(fb)
    return np.array([composite_reward(1.0, a is not None, bool(s)) for a, s in zip(fb.answers, solved)],
                    dtype=np.float64)


# Answer checks

def induction_program(answer: Optional[str]) -> Optional[str]:
    """The program a solver's induction answer stands for: ``lambda ...`` becomes ``f = lambda ...``; text
    that already defines ``f`` is used as it is; anything else is no program (None)."""
    if answer is None or not str(answer).strip():
        return None
    a = str(answer).strip()
    if a.startswith("lambda"):
        return f"f = {a}\n"
    program = a + "\n"
    return program if static_check(program) is None else None


@dataclass
class AnswerCheck:
    """``check(answer) -> bool`` of one code task (AZR §3.3, "verification"; the task types: module docstring), as
    plain data. A check that crossed to another process must be re-bound (:meth:`bind`) before it can run code."""

    kind: str
    output: str = ""  # the executed output f(x) (deduction, abduction)
    program: str = ""  # f (abduction)
    pairs: tuple[tuple[str, str], ...] = ()  # every (input, output) pair (induction)
    sandbox: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in TASK_TYPES:
            raise ValueError(f"Absolute Zero task type {self.kind!r}: known {TASK_TYPES}")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["sandbox"] = None  # a live sandbox (server process, lock) never crosses processes
        return state

    def bind(self, sandbox: Any) -> "AnswerCheck":
        self.sandbox = sandbox
        return self

    def __call__(self, answer: Optional[str]) -> bool:
        if answer is None:
            return False
        if self.kind == "deduction":
            return check_deduction(self.output, answer)
        if self.sandbox is None:
            raise RuntimeError(f"{self.kind} check has no sandbox (it was unpickled on another rank?): "
                               "call .bind(sandbox) first")
        if self.kind == "abduction":
            return check_abduction(self.sandbox, self.program, answer, self.output)
        program = induction_program(answer)
        return program is not None and check_induction(self.sandbox, program, self.pairs)


# Proposals -> tasks (the ``code_reasoning`` task builder; ``method.extra.task_format``)
_FENCE = re.compile(r"```(\w*)[ \t]*\n(.*?)```", re.DOTALL)
MAX_INDUCTION_INPUTS = 10  # AZR proposes 10 inputs per induction task and shows 5 (its Appendix example)

QUESTIONS = {
    "deduction": ("Here is a Python function and an input.\n```python\n{program}```\nInput: {input}\n"
                  "What does f return for this input? Reason it through step by step without running the code, "
                  "then give the returned value as a Python literal in \\boxed{{}}."),
    "abduction": ("Here is a Python function.\n```python\n{program}```\nFind an input x for which f(x) returns "
                  "{output}. Reason it through step by step without running the code, then give x as a Python "
                  "literal in \\boxed{{}}."),
    "induction": ("A hidden Python function f maps these inputs to these outputs:\n{pairs}\n{message}"
                  "It is also checked on inputs not shown here. Write f as a Python lambda expression in "
                  "\\boxed{{}}, e.g. \\boxed{{lambda x: x + 1}}."),
}


# The reasons of a proposal with nothing to validate (no program or no input can be read).
NO_PROGRAM = "no ```python block with f"
NO_INPUT = "no ```input block"


def proposal_reward(task: Any, learnability: Optional[float] = None) -> float:
    """The proposer's composite reward of one Planning output (module docstring): −1 for an invalid ``task``; for a
    valid one (or ``task`` None) its ``learnability``, −0.5 when that is 0."""
    if task is not None and not task.valid:
        return composite_reward(0.0, False, False)
    if learnability is None:
        raise ValueError("a valid proposal's reward is its learnability: give it")
    return composite_reward(learnability, True, learnability > 0)


def parse_proposal(text: str) -> tuple[Optional[str], list[str]]:
    """(program, inputs) from a proposer output: the first ```python block and every ```input block."""
    program, inputs = None, []
    for lang, body in _FENCE.findall(text):
        if lang == "python" and program is None:
            program = body if body.endswith("\n") else body + "\n"
        elif lang == "input" and body.strip():
            inputs.append(body.strip())
    return program, inputs


def parse_message(text: str) -> str:
    """The proposer's description of ``f`` for an induction task (AZR's message m): a ```message block."""
    for lang, body in _FENCE.findall(text):
        if lang == "message" and body.strip():
            return body.strip()
    return ""


def _distinct(inputs: Sequence[str]) -> list[str]:
    """Inputs with repeated values dropped (a repeated input would let a shown pair stand in for a hidden one)."""
    seen, out = set(), []
    for inp in inputs:
        kind, value = literal_or_text(inp)
        key = repr(value) if kind == "lit" else inp
        if key not in seen:
            seen.add(key)
            out.append(inp)
    return out


def check_task_types(topics: Sequence[str]) -> None:
    """Fail on a topic that is no Absolute Zero task type (``player.topics`` with this method)."""
    bad = [t for t in topics if t not in TASK_TYPES]
    if bad:
        raise ValueError(f"Absolute Zero: player.topics {bad} are no task types; known {list(TASK_TYPES)}")


def build_code_task(task: Any, sandbox: Any, max_induction_inputs: int = MAX_INDUCTION_INPUTS) -> Any:
    """Turn a proposer output (its task type: its topic) into a validated code task with its :class:`AnswerCheck`;
    an invalid proposal stays a malformed task with its reason, and a topic that is no task type is an error."""
    from unifiedplayers.players.planning import PlanningTask

    kind = task.topic
    check_task_types([kind])
    program, inputs = parse_proposal(task.text)

    def malformed(reason: str) -> Any:
        return PlanningTask(task.text, None, None, False, reason, task.prompt_index, task.topic, task.completion)

    if program is None:
        return malformed(NO_PROGRAM)
    if not inputs:
        return malformed(NO_INPUT)
    inputs = _distinct(inputs)[: (max_induction_inputs if kind == "induction" else 1)]
    if kind == "induction" and len(inputs) < 2:
        return malformed("induction needs at least 2 distinct ```input blocks (half shown, all checked)")
    pairs = []
    for inp in inputs:
        got = validate_proposal(sandbox, program, inp)
        if not got.valid:
            return malformed(f"invalid proposal: {got.reason}")
        pairs.append((inp, got.output))
    if kind == "deduction":
        question = QUESTIONS[kind].format(program=program, input=pairs[0][0])
        expected, check = pairs[0][1], AnswerCheck("deduction", output=pairs[0][1])
    elif kind == "abduction":
        question = QUESTIONS[kind].format(program=program, output=pairs[0][1])
        expected = pairs[0][0]  # one input that works; any input with the same output is correct
        check = AnswerCheck("abduction", output=pairs[0][1], program=program, sandbox=sandbox)
    else:  # AZR: the first half of the pairs is shown, all of them are checked
        shown = pairs[: len(pairs) // 2]
        message = parse_message(task.text)
        question = QUESTIONS[kind].format(pairs="\n".join(f"f({i}) = {o}" for i, o in shown),
                                          message=f"Hint: {message}\n" if message else "")
        expected = None  # any f that reproduces every pair is correct
        check = AnswerCheck("induction", pairs=tuple(pairs), sandbox=sandbox)
    out = PlanningTask(task.text, question, expected, True, "", task.prompt_index, task.topic, task.completion)
    out.check = check
    return out


# One model for proposer and solver (``method.shared_model``)

def shared_model(method_cfg: Any) -> bool:
    """``method.shared_model`` (AZR: one set of weights proposes and solves); default false (two players)."""
    value = getattr(method_cfg, "shared_model", False)
    if not isinstance(value, bool):
        raise ValueError(f"method.shared_model={value!r}: need true or false")
    return value


def check_shared_model(method_cfg: Any) -> None:
    """Start-up check: sharing needs both roles it joins to be trained."""
    if shared_model(method_cfg) and not {"planning", "execution"} <= set(method_cfg.roles):
        raise ValueError(f"method.shared_model=true joins the planning and execution players; method.roles="
                         f"{list(method_cfg.roles)} does not train both")


TASK_FORMATS = ("code_reasoning", "math")


@dataclass
class AbsoluteZeroSettings:
    """``method.extra`` of Absolute Zero."""

    task_format: str = "math"  # code_reasoning (AZR's code puzzles) | math (the Planning player's tasks)


@register_method("absolute_zero")
class AbsoluteZero(Method):
    """Absolute Zero: the proposer's programs become code-reasoning tasks, validated and answered in the sandbox."""

    Settings = AbsoluteZeroSettings

    @property
    def code_tasks(self) -> bool:
        return self.settings.task_format == "code_reasoning"

    @property
    def prompt_shows_code(self) -> bool:  # the solver's prompt shows programs to reason about: the task itself
        return self.code_tasks

    def check(self) -> None:
        if self.settings.task_format not in TASK_FORMATS:
            raise ValueError(f"method.extra.task_format={self.settings.task_format!r}: known {list(TASK_FORMATS)}")
        shared_model(self.method_cfg)
        if self.code_tasks:
            from unifiedplayers.config import resolve_player_config

            check_task_types(resolve_player_config(self.cfg).topics)  # fails here, not in the first phase
        super().check()

    def build_task(self, task: Any, sandbox: Any) -> Any:
        return build_code_task(task, sandbox) if self.code_tasks else task

    def malformed_task_reward(self, task: Any) -> float:
        """Code tasks: :func:`proposal_reward` (−1); a math-format run keeps ``reward.malformed_task_reward``."""
        return proposal_reward(task) if self.code_tasks else super().malformed_task_reward(task)
