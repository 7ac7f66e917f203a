"""The fixed perturbation engine (Appendix F.1, Table 9): P adversarial variants per trajectory.

Five rules (local: ``arg_mutation``, ``step_drop``, ``step_swap``; global: ``early_terminate``,
``tool_substitute``) return a new :class:`Trajectory` or ``None`` where they cannot apply (masked out by
``adv_mask``). A rule is a function registered with :func:`register_rule` and listed in ``perturbation.rules``;
one outside the package is a file named in ``perturbation.modules`` (``examples/custom_rule/``).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import io
import math
import random
import re
import tokenize
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Optional, Sequence

from unifiedplayers.feedback.observation import DEFAULT_OBSERVATION_MAX_CHARS, observation_body
from unifiedplayers.registry import Registry
from unifiedplayers.feedback.trajectory import (PYTHON_LABELS, Step, Trajectory, extract_boxed, output_step,
                                                state_answer)

Executor = Callable[[Sequence[str]], list[str]]  # code blocks -> observation texts, in order
SCOPES = ("local", "global")  # Table 15: edits of one step (local) or of the trajectory's structure (global)


@dataclass(frozen=True)
class RuleParams:
    """Settings shared by the rules (``conf/perturbation/``)."""

    int_offsets: tuple[int, ...] = (-2, -1, 1, 2)
    float_rel_change: float = 0.05
    substitute_lang: str = "bash"
    execute: Optional[Executor] = None  # arg_mutation's re-execution; the engine supplies the sandbox


RuleFn = Callable[[Trajectory, random.Random, RuleParams], Optional[Trajectory]]
Proposal = Optional[tuple[Trajectory, int]]  # (the variant, the index of the code step whose output is to be re-run)


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``rule(traj, rng, params)`` is its variant of ``traj`` (None where it cannot apply)."""

    name: str
    fn: RuleFn
    scope: str  # local | global
    abbrev: str  # its column in the summary's verdict table (default: the name)
    # A rule that re-executes code (arg_mutation): the variant without its new output and the index of the code
    # step, drawing exactly as ``fn`` does; the engine re-runs every proposal of a batch in one sandbox call.
    propose: Optional[Callable[[Trajectory, random.Random, RuleParams], Proposal]] = None

    def __call__(self, traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
        return self.fn(traj, rng, params)

    @property
    def executes(self) -> bool:
        return self.propose is not None

    @property
    def __wrapped__(self) -> RuleFn:  # where the rule is defined (the registry's messages)
        return self.fn


RULES = Registry("perturbation rule", "perturbation.rules")


def register_rule(name: str, scope: str, *, abbrev: Optional[str] = None,
                  propose: Optional[Callable[[Trajectory, random.Random, RuleParams], Proposal]] = None):
    """Register the decorated ``fn(traj, rng, params) -> Trajectory | None`` as rule ``name`` of ``scope`` (local |
    global); ``abbrev`` and ``propose``: see :class:`Rule`."""
    if scope not in SCOPES:
        raise ValueError(f"register_rule({name!r}): scope {scope!r} is not one of {SCOPES}")

    def deco(fn: RuleFn) -> RuleFn:
        RULES.register(name, Rule(name, fn, scope, abbrev or name, propose), stacklevel=2)
        return fn

    return deco


def import_rule_modules(modules: Sequence[str]) -> None:
    """Import the modules of ``perturbation.modules`` (rules outside the package register when imported)."""
    for module in modules:
        try:
            importlib.import_module(str(module))
        except ImportError as e:
            raise ValueError(f"perturbation.modules: {module!r} cannot be imported ({e}); is its folder on "
                             "PYTHONPATH?") from None


def _is_python(step: Step) -> bool:
    return step.type == "code" and (step.lang or "").lower() in PYTHON_LABELS


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
    """Mutable numeric literals of ``code``, in order (tokens, so strings and comments are skipped): not complex
    literals, nor floats a relative shift cannot change (0.0, inf). Code that cannot be tokenized holds none."""
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


def _set_output(traj: Trajectory, code_index: int, observation: str) -> None:  # inserted where there was none
    nxt = code_index + 1
    if nxt < len(traj.steps) and traj.steps[nxt].type == "output":
        traj.steps[nxt].result = observation
    else:
        traj.steps.insert(nxt, output_step(observation))


@register_rule("arg_mutation", "local", abbrev="arg", propose=propose_arg_mutation)
def arg_mutation(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: one numeric literal of a python code step, drawn uniformly, gets an offset from ``int_offsets`` or a
    ±``float_rel_change`` shift (:func:`numeric_literals` says which count); the code is re-executed and its output
    step replaced or inserted, formatted as the tool loop formats observations (see :class:`PerturbationEngine`)."""
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


@register_rule("step_drop", "local", abbrev="drop")
def step_drop(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: remove one reason step chosen uniformly; code and output steps are never dropped."""
    reasons = [i for i, s in enumerate(traj.steps) if s.type == "reason"]
    if not reasons:
        return None
    out = traj.copy()
    del out.steps[rng.choice(reasons)]
    return out


def movable_spans(steps: Sequence[Step]) -> list[tuple[int, int]]:
    """Half-open index ranges of the movable spans (Appendix F.1's "units"): a code step with the output right after
    it is one span, every other step is a span of its own."""
    spans, i = [], 0
    while i < len(steps):
        j = i + 2 if steps[i].type == "code" and i + 1 < len(steps) and steps[i + 1].type == "output" else i + 1
        spans.append((i, j))
        i = j
    return spans


@register_rule("step_swap", "local", abbrev="swap")
def step_swap(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Local: swap two adjacent units (:func:`movable_spans`) chosen uniformly among the pairs that differ."""
    spans = movable_spans(traj.steps)
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
_GROUPED_INT = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+")  # 1,000 or 12,345,678
_DEC = re.compile(r"[+-]?\d*\.\d+")
_FRAC = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")
_TEXFRAC = re.compile(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
# A unit after the number, kept on every distractor: "12\%", "45^\circ", "30 \text{ cm}", "7 dollars".
_UNIT = re.compile(r"(.*?\S)(\s*(?:\\%|%|\^\s*\{?\\circ\}?|°|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|[A-Za-z]+))")
# Non-numeric answers that already mean zero or nothing: their distractor is 1 instead of 0.
_ZERO_WORDS = {"zero", "none", "nothing", "no", "\\emptyset", "\\varnothing", "\\{\\}"}


def _exact_decimal(v: Fraction, places: int) -> str:
    """``v`` with at least ``places`` digits after the point (exact when it terminates)."""
    d = Decimal(v.numerator) / Decimal(v.denominator)
    if (v * 10**places).denominator == 1:
        return f"{d:.{places}f}"
    return format(d.normalize(), "f")


def _parse_number(a: str) -> Optional[tuple[Fraction, Callable[[Fraction], str], bool]]:
    """(exact value, formatter in the style of ``a``, integer-valued style) of a bare number."""
    if _INT.fullmatch(a):
        return Fraction(int(a)), lambda v: _exact_decimal(v, 0), True
    if _GROUPED_INT.fullmatch(a):
        def grouped(v: Fraction) -> str:
            return f"{v.numerator:,}" if v.denominator == 1 else _exact_decimal(v, 0)

        return Fraction(int(a.replace(",", ""))), grouped, True
    if _DEC.fullmatch(a):
        places = len(a.split(".")[1])
        return Fraction(Decimal(a)), lambda v: _exact_decimal(v, places), False

    def frac_fmt(tex: bool) -> Callable[[Fraction], str]:
        def fmt(v: Fraction) -> str:
            if v.denominator == 1:
                return str(v.numerator)
            sign = "-" if v < 0 else ""
            n, d = abs(v.numerator), v.denominator
            return f"{sign}\\frac{{{n}}}{{{d}}}" if tex else f"{sign}{n}/{d}"

        return fmt

    m = _FRAC.fullmatch(a)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2))), frac_fmt(False), False
    m = _TEXFRAC.fullmatch(a)
    if m and int(m.group(3)) != 0:
        v = Fraction(int(m.group(2)), int(m.group(3)))
        return (-v if m.group(1) else v), frac_fmt(True), False
    return None


def _numeric_answer(answer: str) -> Optional[tuple[Fraction, Callable[[Fraction], str], bool]]:
    """(exact value, formatter in the answer's own style, integer style) of a numeric answer: an int
    (1,000 grouping too), a decimal, a/b or \\frac{a}{b}, optionally inside $...$ and followed by a
    unit (\\%, ^\\circ, \\text{..}, a word) that every formatted value keeps. None for anything else."""
    a = answer.strip().strip("$").strip()
    if len(a) > 1000:  # past int()'s digit limit and no plausible task answer: treated as non-numeric
        return None
    parsed = _parse_number(a)
    if parsed is not None:
        return parsed
    m = _UNIT.fullmatch(a)
    parsed = _parse_number(m.group(1).strip()) if m else None
    if parsed is None:
        return None
    value, fmt, integral = parsed
    unit = m.group(2)
    return value, (lambda v: fmt(v) + unit), integral


def _round_half_away(v: Fraction, step: int = 1) -> Fraction:
    """``v`` rounded to a multiple of ``step``, halves away from zero (25 -> 30, -25 -> -30)."""
    q = abs(v) / step
    n = int(q) + (1 if q - int(q) >= Fraction(1, 2) else 0)
    return Fraction((n if v >= 0 else -n) * step)


def distractor_candidates(value: Fraction, integral: bool) -> list[tuple[str, Fraction]]:
    """The early_terminate pool before de-duplication, in order (Appendix F.1, I.4):
    off-by-one below and above, rounded to tens, +10 % and −10 % (rounded to an integer, halves away
    from zero, when the answer is written as an integer; exact otherwise), and zero."""
    def scale(f: Fraction) -> Fraction:
        return _round_half_away(value * f) if integral else value * f

    return [
        ("minus_one", value - 1),
        ("plus_one", value + 1),
        ("round_tens", _round_half_away(value, 10)),
        ("plus_10pct", scale(Fraction(11, 10))),
        ("minus_10pct", scale(Fraction(9, 10))),
        ("zero", Fraction(0)),
    ]


def distractors_for(answer: Optional[str]) -> list[str]:
    """Fabricated final answers for early_terminate, none equal in value to ``answer``.

    A numeric answer (:func:`_numeric_answer`): :func:`distractor_candidates` in the answer's own style (``"4.0"``
    gives ``"3.0"``, a unit is kept), less those equal to the answer or to an earlier one. Otherwise ``["0"]``, or
    ``["1"]`` when the answer is a word for zero or the empty set (``none``, ``\\emptyset``).
    """
    parsed = _numeric_answer(answer) if answer is not None else None
    if parsed is None:
        words = (answer or "").strip().strip("$").strip().lower()
        return ["1"] if words in _ZERO_WORDS else ["0"]
    value, fmt, integral = parsed
    pool, seen = [], {value}
    for _, v in distractor_candidates(value, integral):
        if v not in seen:
            seen.add(v)
            pool.append(fmt(v))
    return pool


@register_rule("early_terminate", "global", abbrev="early")
def early_terminate(traj: Trajectory, rng: random.Random, params: RuleParams) -> Trajectory:
    """Global: cut at a unit boundary (:func:`movable_spans`) at or before the last reason step that boxes the final
    answer (the end, without one), keeping a step where there is one before it, and state a fabricated answer
    (:func:`distractors_for`) in the last reasoning step (``state_answer``, Appendix I.4), so that only its content
    gives it away. Always applies."""
    pool = distractors_for(traj.final_answer)
    answer_at = len(traj.steps)
    if traj.final_answer is not None:
        for i in range(len(traj.steps) - 1, -1, -1):
            s = traj.steps[i]
            if s.type == "reason" and extract_boxed(s.text or "") == traj.final_answer:
                answer_at = i
                break
    cuts = [end for _, end in movable_spans(traj.steps) if 1 <= end <= answer_at] or [0]
    cut = rng.choice(cuts)
    out = traj.copy()
    del out.steps[cut:]
    state_answer(out, rng.choice(pool))
    return out


# ---------------------------------------------------------------------------------------------------
# tool_substitute


@register_rule("tool_substitute", "global", abbrev="tool")
def tool_substitute(traj: Trajectory, rng: random.Random, params: RuleParams) -> Optional[Trajectory]:
    """Global: one python code step declares another language; code body and output are unchanged."""
    candidates = [i for i, s in enumerate(traj.steps) if _is_python(s)]
    if not candidates:
        return None
    out = traj.copy()
    out.steps[rng.choice(candidates)].lang = params.substitute_lang
    return out


# The five built-in rules (Table 9), by scope: the default perturbation.rules.
LOCAL_RULES = tuple(name for name in RULES.names() if RULES.get(name).scope == "local")
GLOBAL_RULES = tuple(name for name in RULES.names() if RULES.get(name).scope == "global")
ALL_RULES = LOCAL_RULES + GLOBAL_RULES


def rule_rng(seed: int, rule: str, traj: Trajectory) -> random.Random:
    """The generator of one (trajectory, rule) pair: independent of batch order and of other rules."""
    digest = hashlib.sha256(f"{seed}\x00{rule}\x00{traj.to_json()}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class PerturbationEngine:
    """Applies the configured rules to trajectories: ``perturb(traj)`` gives one entry per rule.

    ``sandbox`` is needed only by a rule that re-executes code. Its outputs are formatted as the tool loop's
    (:func:`~unifiedplayers.feedback.observation.observation_body`, or ``format_result``: ExecResult -> text) and
    truncated to ``observation_max_chars``, which must be ``player.observation_max_chars``: an output formatted
    differently from the originals' would give the variant away.
    """

    def __init__(self, rules: Optional[Sequence[str]] = None, seed: int = 0, sandbox: Any = None, *,
                 int_offsets: Sequence[int] = (-2, -1, 1, 2), float_rel_change: float = 0.05,
                 substitute_lang: str = "bash", observation_max_chars: int = DEFAULT_OBSERVATION_MAX_CHARS,
                 format_result: Optional[Callable[[Any], str]] = None) -> None:
        self.rules = tuple(ALL_RULES if rules is None else rules)
        unknown = [r for r in self.rules if r not in RULES]
        if unknown:
            raise ValueError(f"unknown perturbation rules {unknown}; known: {RULES.names()} (a rule outside the "
                             "package is imported from perturbation.modules)")
        if len(set(self.rules)) != len(self.rules):
            raise ValueError(f"a rule is listed twice: {list(self.rules)}")
        executing = [r for r in self.rules if RULES.get(r).executes]
        if executing and sandbox is None:
            raise ValueError(f"{', '.join(executing)} re-executes the mutated code: PerturbationEngine needs a sandbox")
        if not int_offsets or 0 in int_offsets:
            raise ValueError("int_offsets must be non-empty and exclude 0")
        if not 0.0 < float_rel_change < 1.0:
            raise ValueError("float_rel_change must be in (0, 1)")
        if substitute_lang.lower() in PYTHON_LABELS:
            raise ValueError("tool_substitute must change the language away from python")
        self.seed = seed
        self.sandbox = sandbox
        self.observation_max_chars = int(observation_max_chars)
        self.format_result = format_result or functools.partial(observation_body, max_chars=self.observation_max_chars)
        self.params = RuleParams(tuple(int_offsets), float_rel_change, substitute_lang, self._execute)

    @classmethod
    def from_config(cls, cfg: Any, seed: int = 0, sandbox: Any = None, *,
                    observation_max_chars: int = DEFAULT_OBSERVATION_MAX_CHARS,
                    format_result: Optional[Callable[[Any], str]] = None) -> "PerturbationEngine":
        """Build from a ``PerturbationConfig`` node (``conf/perturbation/``), its ``modules`` imported first."""
        import_rule_modules(list(getattr(cfg, "modules", None) or []))
        return cls(list(cfg.rules), seed, sandbox, int_offsets=list(cfg.int_offsets),
                   float_rel_change=cfg.float_rel_change, substitute_lang=cfg.substitute_lang,
                   observation_max_chars=observation_max_chars, format_result=format_result)

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
        """``perturb`` for each trajectory; all re-executions (arg_mutation's) go to the sandbox as one batch."""
        rules = [RULES.get(name) for name in self.rules]
        results: list[list[Optional[Trajectory]]] = []
        pending: list[tuple[Trajectory, int]] = []
        for traj in trajectories:
            row: list[Optional[Trajectory]] = []
            for rule in rules:
                rng = rule_rng(self.seed, rule.name, traj)
                if rule.executes:  # the same draws as the rule itself, its execution deferred
                    proposal = rule.propose(traj, rng, self.params)
                    row.append(None if proposal is None else proposal[0])
                    if proposal is not None:
                        pending.append(proposal)
                else:
                    row.append(rule(traj, rng, self.params))
            results.append(row)
        observations = self._execute([t.steps[i].code or "" for t, i in pending])
        for (variant, idx), obs in zip(pending, observations):
            _set_output(variant, idx, obs)
        return results
