"""The fixed perturbation engine (SPEC §3; paper Appendix F.1): P adversarial variants per trajectory.

Five rules, one variant each. A rule returns a new :class:`Trajectory` (the input is never modified)
or ``None`` where it cannot apply; the verdict matrix masks those entries out (``adv_mask``).

- arg_mutation (local): one numeric literal of a python code step, drawn uniformly among all of them,
  gets an integer offset from {-2,-1,+1,+2} or a ±5% float shift; the code is re-executed in the
  sandbox and its output step replaced (inserted if the code had none).
  None when no python code step holds a literal that can change (literals in strings and comments
  do not count; complex literals, 0.0 and inf are skipped).
- step_drop (local): removes one reason step chosen uniformly. None when there is no reason step.
- step_swap (local): swaps two adjacent units, chosen uniformly; a code step and the output right
  after it form one unit. None with fewer than two units or when every adjacent pair is identical.
- early_terminate (global): keeps the steps before a random cut (a unit boundary at or before the
  step that states the final answer), drops the rest and sets a fabricated final answer: the
  answer ± 1 or zero, never equal to the original (a non-numeric or missing answer: zero).
  Always applies.
- tool_substitute (global): one python code step, chosen uniformly, gets lang "bash"; code and
  recorded output unchanged. None when there is no python code step.

Randomness: each (trajectory, rule) pair draws from its own ``random.Random`` seeded by a hash of the
engine seed, the rule name and the trajectory's content, so a variant never depends on batch order or
on which other rules are configured.
"""
from __future__ import annotations

import ast
import hashlib
import io
import math
import random
import re
import tokenize
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Callable, Optional, Sequence

from unifiedplayers.trajectory import Step, Trajectory, extract_boxed, format_observation, output_step

LOCAL_RULES = ("arg_mutation", "step_drop", "step_swap")
GLOBAL_RULES = ("early_terminate", "tool_substitute")
ALL_RULES = LOCAL_RULES + GLOBAL_RULES
RULE_KINDS = {**{r: "local" for r in LOCAL_RULES}, **{r: "global" for r in GLOBAL_RULES}}

Executor = Callable[[Sequence[str]], list[str]]  # code blocks -> observation texts, in order


@dataclass(frozen=True)
class RuleParams:
    """Settings shared by the rules (``conf/perturbation/``)."""

    int_offsets: tuple[int, ...] = (-2, -1, 1, 2)
    float_rel_change: float = 0.05
    substitute_lang: str = "bash"
    execute: Optional[Executor] = None  # arg_mutation's re-execution; the engine supplies the sandbox


def _is_python(step: Step) -> bool:
    return step.type == "code" and (step.lang or "").lower() in ("python", "py", "python3")


# ---------------------------------------------------------------------------------------------------
# arg_mutation


@dataclass(frozen=True)
class NumericLiteral:
    """A NUMBER token of a code step: character offsets into the code and its value."""

    step: int
    start: int
    end: int
    text: str
    value: Any  # int or float


def numeric_literals(code: str, step_index: int = 0) -> list[NumericLiteral]:
    """Mutable numeric literals of ``code``, in order (tokens, so strings and comments are skipped).

    Complex literals and floats a relative shift cannot change (0.0, inf) are left out. Code that cannot
    be tokenized holds no literal.
    """
    line_starts = [0]
    for line in io.StringIO(code):
        line_starts.append(line_starts[-1] + len(line))
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type != tokenize.NUMBER or tok.string[-1] in "jJ":
                continue
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an int past Python's 4300-digit conversion limit
                continue
            if isinstance(value, float) and (value == 0.0 or not math.isfinite(value)):
                continue
            start = line_starts[tok.start[0] - 1] + tok.start[1]
            end = line_starts[tok.end[0] - 1] + tok.end[1]
            found.append(NumericLiteral(step_index, start, end, tok.string, value))
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        return []
    return found


def _mutated_literal(lit: NumericLiteral, rng: random.Random, params: RuleParams) -> str:
    if isinstance(lit.value, int):
        new: Any = lit.value + rng.choice(params.int_offsets)
    else:
        new = lit.value * (1.0 + rng.choice((-1.0, 1.0)) * params.float_rel_change)
        if not math.isfinite(new):  # +5% of a float near the maximum overflows: shift down instead
            new = lit.value * (1.0 - params.float_rel_change)
    text = repr(new)
    return f"({text})" if new < 0 else text  # parenthesised so `x-1` -> `x-(-1)`, never `x--1` surprises


def propose_arg_mutation(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[tuple[Trajectory, int]]:
    """The mutated trajectory (output not yet re-executed) and the index of the mutated code step."""
    literals = [lit for i, s in enumerate(traj.steps) if _is_python(s) for lit in numeric_literals(s.code or "", i)]
    if not literals:
        return None
    lit = rng.choice(literals)
    new_text = _mutated_literal(lit, rng, params)
    out = traj.copy()
    code = out.steps[lit.step].code or ""
    out.steps[lit.step].code = code[: lit.start] + new_text + code[lit.end :]
    return out, lit.step


def _set_output(traj: Trajectory, code_index: int, observation: str) -> None:
    """Replace the recorded output of the code step at ``code_index`` (insert one if it had none)."""
    nxt = code_index + 1
    if nxt < len(traj.steps) and traj.steps[nxt].type == "output":
        traj.steps[nxt].result = observation
    else:
        traj.steps.insert(nxt, output_step(observation))


def arg_mutation(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: perturb one numeric literal, re-execute that code step, record its new output."""
    if params.execute is None:
        raise ValueError("arg_mutation re-executes code: give the engine a sandbox")
    proposal = propose_arg_mutation(traj, rng, params)
    if proposal is None:
        return None
    out, idx = proposal
    _set_output(out, idx, params.execute([out.steps[idx].code or ""])[0])
    return out


# ---------------------------------------------------------------------------------------------------
# step_drop, step_swap


def step_drop(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: remove one reason step chosen uniformly; code and output steps are never dropped."""
    reasons = [i for i, s in enumerate(traj.steps) if s.type == "reason"]
    if not reasons:
        return None
    out = traj.copy()
    del out.steps[rng.choice(reasons)]
    return out


def units(steps: Sequence[Step]) -> list[tuple[int, int]]:
    """Half-open index ranges of the movable units: a code step with the output right after it is one
    unit, every other step is a unit of its own."""
    spans, i = [], 0
    while i < len(steps):
        j = i + 2 if steps[i].type == "code" and i + 1 < len(steps) and steps[i + 1].type == "output" else i + 1
        spans.append((i, j))
        i = j
    return spans


def step_swap(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: swap two adjacent units, never separating a code step from its output."""
    spans = units(traj.steps)
    steps = traj.steps
    pairs = [u for u in range(len(spans) - 1) if steps[slice(*spans[u])] != steps[slice(*spans[u + 1])]]
    if not pairs:
        return None
    u = rng.choice(pairs)
    (a0, a1), (b0, b1) = spans[u], spans[u + 1]
    out = traj.copy()
    out.steps[a0:b1] = out.steps[b0:b1] + out.steps[a0:a1]
    return out


# ---------------------------------------------------------------------------------------------------
# early_terminate

_INT = re.compile(r"[+-]?\d+")
_DEC = re.compile(r"[+-]?\d*\.\d+")
_FRAC = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")
_TEXFRAC = re.compile(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")


def _numeric_answer(answer: str) -> Optional[tuple[Any, Callable[[Any], str]]]:
    """(value, formatter in the answer's own style) for an int, decimal, a/b or \\frac{a}{b} answer."""
    a = answer.strip().strip("$").strip()
    if len(a) > 1000:  # past int()'s digit limit and no plausible task answer: treated as non-numeric
        return None
    if _INT.fullmatch(a):
        return int(a), lambda v: str(v)
    if _DEC.fullmatch(a):
        try:
            return Decimal(a), lambda v: str(v)
        except InvalidOperation:
            return None

    def frac_fmt(tex: bool) -> Callable[[Any], str]:
        def fmt(v: Fraction) -> str:
            if v.denominator == 1:
                return str(v.numerator)
            sign = "-" if v < 0 else ""
            n, d = abs(v.numerator), v.denominator
            return f"{sign}\\frac{{{n}}}{{{d}}}" if tex else f"{sign}{n}/{d}"

        return fmt

    m = _FRAC.fullmatch(a)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2))), frac_fmt(False)
    m = _TEXFRAC.fullmatch(a)
    if m and int(m.group(3)) != 0:
        v = Fraction(int(m.group(2)), int(m.group(3)))
        return (-v if m.group(1) else v), frac_fmt(True)
    return None


def distractor_pool(answer: Optional[str]) -> list[str]:
    """Fabricated answers for early_terminate: off-by-one neighbours of a numeric answer and zero,
    none equal (in value) to the answer. A missing or non-numeric answer has zero alone."""
    parsed = _numeric_answer(answer) if answer is not None else None
    if parsed is None:
        return ["0"]  # "0" itself parses as a number, so a non-numeric answer never equals it
    value, fmt = parsed
    pool, seen = [], set()
    for v in (value - 1, value + 1, 0):
        if v != value and v not in seen:
            seen.add(v)
            pool.append("0" if v == 0 else fmt(v))
    return pool


def early_terminate(traj: Trajectory, rng: random.Random, params: RuleParams) -> Trajectory:
    """Global: cut before the final answer, drop the rest, append a fabricated final answer.

    Cut points are unit boundaries (a code step keeps its output) at or before the step that states the
    final answer (the last reason step whose \\boxed{} is the answer; without one, the end of the steps),
    keeping at least one step when there is one before the answer.
    """
    pool = distractor_pool(traj.final_answer)
    answer_at = len(traj.steps)
    if traj.final_answer is not None:
        for i in range(len(traj.steps) - 1, -1, -1):
            s = traj.steps[i]
            if s.type == "reason" and extract_boxed(s.text or "") == traj.final_answer:
                answer_at = i
                break
    cuts = [end for _, end in units(traj.steps) if 1 <= end <= answer_at] or [0]
    cut = rng.choice(cuts)
    out = traj.copy()
    del out.steps[cut:]
    out.final_answer = rng.choice(pool)
    return out


# ---------------------------------------------------------------------------------------------------
# tool_substitute


def tool_substitute(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Global: one python code step declares another language; code body and output are unchanged."""
    candidates = [i for i, s in enumerate(traj.steps) if _is_python(s)]
    if not candidates:
        return None
    out = traj.copy()
    out.steps[rng.choice(candidates)].lang = params.substitute_lang
    return out


RuleFn = Callable[[Trajectory, random.Random, RuleParams], Optional[Trajectory]]
RULES: dict[str, RuleFn] = {
    "arg_mutation": arg_mutation,
    "step_drop": step_drop,
    "step_swap": step_swap,
    "early_terminate": early_terminate,
    "tool_substitute": tool_substitute,
}


def rule_rng(seed: int, rule: str, traj: Trajectory) -> random.Random:
    """The generator of one (trajectory, rule) pair: independent of batch order and of other rules."""
    digest = hashlib.sha256(f"{seed}\x00{rule}\x00{traj.to_json()}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def observation_of(result: Any) -> str:
    """Observation text of a sandbox ``ExecResult`` (same format as the Execution tool loop)."""
    return format_observation(
        result.stdout,
        result.stderr,
        result.exit_code,
        timed_out=bool(getattr(result, "timed_out", False)),
        memory_exceeded=bool(getattr(result, "memory_exceeded", False)),
    )


class PerturbationEngine:
    """Applies the configured rules to trajectories: ``perturb(traj)`` gives one entry per rule.

    ``sandbox`` (a ``unifiedplayers.sandbox.Sandbox``) is needed only by arg_mutation; ``format_result``
    turns its ``ExecResult`` into observation text (default :func:`observation_of`). It must match how
    the Execution tool loop wrote the original outputs, or the format alone would give variants away.
    """

    def __init__(
        self,
        rules: Optional[Sequence[str]] = None,
        seed: int = 0,
        sandbox: Any = None,
        *,
        int_offsets: Sequence[int] = (-2, -1, 1, 2),
        float_rel_change: float = 0.05,
        substitute_lang: str = "bash",
        format_result: Callable[[Any], str] = observation_of,
    ) -> None:
        self.rules = tuple(ALL_RULES if rules is None else rules)
        unknown = [r for r in self.rules if r not in RULES]
        if unknown:
            raise ValueError(f"unknown perturbation rules {unknown}; known: {list(RULES)}")
        if len(set(self.rules)) != len(self.rules):
            raise ValueError(f"a rule is listed twice: {list(self.rules)}")
        if "arg_mutation" in self.rules and sandbox is None:
            raise ValueError("arg_mutation re-executes the mutated code: PerturbationEngine needs a sandbox")
        if not int_offsets or 0 in int_offsets:
            raise ValueError("int_offsets must be non-empty and exclude 0")
        if not 0.0 < float_rel_change < 1.0:
            raise ValueError("float_rel_change must be in (0, 1)")
        if substitute_lang.lower() in ("python", "py", "python3"):
            raise ValueError("tool_substitute must change the language away from python")
        self.seed = seed
        self.sandbox = sandbox
        self.format_result = format_result
        self.params = RuleParams(tuple(int_offsets), float_rel_change, substitute_lang, self._execute)

    @classmethod
    def from_config(
        cls, cfg: Any, seed: int = 0, sandbox: Any = None, format_result: Callable[[Any], str] = observation_of
    ) -> "PerturbationEngine":
        """Build from a ``PerturbationConfig`` node (``conf/perturbation/``).

        ``format_result`` must be the Execution tool loop's own formatter (truncation included): a
        re-executed output formatted differently would tell a verifier which trajectory is a variant.
        """
        return cls(
            rules=list(cfg.rules),
            seed=seed,
            sandbox=sandbox,
            int_offsets=list(cfg.int_offsets),
            float_rel_change=cfg.float_rel_change,
            substitute_lang=cfg.substitute_lang,
            format_result=format_result,
        )

    @property
    def num_rules(self) -> int:
        """P, the number of variants per trajectory."""
        return len(self.rules)

    def _execute(self, codes: Sequence[str]) -> list[str]:
        if not codes:
            return []
        return [self.format_result(r) for r in self.sandbox.run_many(list(codes))]

    def perturb(self, traj: Trajectory) -> list[Optional[Trajectory]]:
        """One entry per configured rule, in order: the variant, or None where the rule cannot apply."""
        return self.perturb_many([traj])[0]

    def perturb_many(self, trajectories: Sequence[Trajectory]) -> list[list[Optional[Trajectory]]]:
        """``perturb`` for each trajectory; all arg_mutation re-executions go to the sandbox as one batch."""
        results: list[list[Optional[Trajectory]]] = []
        pending: list[tuple[Trajectory, int]] = []
        for traj in trajectories:
            row: list[Optional[Trajectory]] = []
            for rule in self.rules:
                rng = rule_rng(self.seed, rule, traj)
                if rule == "arg_mutation":  # same draws as RULES["arg_mutation"], execution deferred
                    proposal = propose_arg_mutation(traj, rng, self.params)
                    row.append(None if proposal is None else proposal[0])
                    if proposal is not None:
                        pending.append(proposal)
                else:
                    row.append(RULES[rule](traj, rng, self.params))
            results.append(row)
        observations = self._execute([t.steps[i].code or "" for t, i in pending])
        for (variant, idx), obs in zip(pending, observations):
            _set_output(variant, idx, obs)
        return results
