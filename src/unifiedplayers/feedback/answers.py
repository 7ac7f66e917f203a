"""Answer extraction and grading against references, per answer type (Appendix G.2).

The evaluation harness (``eval/``) and the diagnostic pool (:mod:`unifiedplayers.diagnostics.execution_pool`) both
grade with it. :func:`extract_answer` reads an answer per answer type and mode. Grading:

- ``math``: math-verify, so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` agree; its signal-based timeouts fail off the
  main thread, so they are off and replaced by a length cap and our own CPU-time alarm (:func:`_alarm`).
- ``option``: exact option letter.
- ``string``: exact match after light normalisation (case, surrounding quotes/brackets/punctuation, inner
  whitespace), with a numeric comparison when both sides are numbers (BBEH answers).
- ``program``: graded by running unit tests (``eval.humaneval``), not here.
"""
from __future__ import annotations

import logging
import re
import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from unifiedplayers.feedback.trajectory import extract_boxed, parse_transcript, reasoning_text

# math-verify logs a warning on every call when its timeouts are disabled; we guard it ourselves.
for _name in ("math_verify", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

MAX_PREDICTION_CHARS = 1000  # longer "answers" are degenerate; parsing them can take minutes
GRADE_TIMEOUT_S = 10


class _GradeTimeout(BaseException):
    """Not an Exception: math-verify catches ``Exception`` around its work, which would swallow the timeout."""


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """A timeout of ``seconds`` of this process's CPU time (SIGPROF) on the main thread; a no-op elsewhere (signals
    only reach the main thread). CPU time, not the wall clock, so that a loaded machine never changes a grade."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "ITIMER_PROF"):
        yield
        return

    def _raise(signum, frame):  # noqa: ARG001
        raise _GradeTimeout()

    previous = signal.signal(signal.SIGPROF, _raise)
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.5)  # and again every 0.5 s until it ends
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _as_latex(answer: str) -> str:  # so that math-verify's LaTeX extractor sees one expression
    answer = answer.strip()
    if answer.startswith("$") or "\\boxed" in answer:
        return answer
    return f"${answer}$"


def grade_math(prediction: Optional[str], reference: str) -> bool:
    """True when math-verify finds ``prediction`` equivalent to ``reference`` (both bare answers)."""
    if prediction is None or not prediction.strip() or len(prediction) > MAX_PREDICTION_CHARS:
        return False
    from math_verify import parse, verify

    try:
        with _alarm(GRADE_TIMEOUT_S):
            gold = parse(_as_latex(reference), parsing_timeout=None)
            pred = parse(_as_latex(prediction), parsing_timeout=None)
            if not gold or not pred:
                return _normalise_string(prediction) == _normalise_string(reference)
            return bool(verify(gold, pred, timeout_seconds=None))
    except _GradeTimeout:
        return False
    except Exception:  # math-verify raises on some malformed LaTeX; a wrong answer, not a crash
        return False


def grade_option(prediction: Optional[str], reference: str) -> bool:
    """Exact option letter (case-insensitive)."""
    if prediction is None:
        return False
    return prediction.strip().upper() == reference.strip().upper()


def _normalise_string(text: str) -> str:
    text = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", text)
    text = text.strip().lower()
    text = text.strip(" \t\n.\"'`*")
    if len(text) >= 2 and text[0] + text[-1] in ("()", "[]", "{}"):
        inner = text[1:-1]
        if "," not in inner:  # keep "(1, 2)"-like tuples intact
            text = inner.strip()
    return re.sub(r"\s+", " ", text)


def grade_string(prediction: Optional[str], reference: str) -> bool:
    """Exact match after normalisation; equal numbers (``3`` vs ``3.0``) also match."""
    if prediction is None:
        return False
    p, r = _normalise_string(prediction), _normalise_string(reference)
    if p == r:
        return True
    try:
        return float(p.replace(",", "")) == float(r.replace(",", ""))
    except ValueError:
        return False


# ---- answer extraction -------------------------------------------------------------------------

last_boxed = extract_boxed  # one implementation of \boxed{} extraction (nested braces, last closed box)


def option_letters(num_options: int) -> str:
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:num_options]


def extract_option_letter(text: str, num_options: int = 4) -> Optional[str]:
    """The final option letter chosen in ``text`` for a question with ``num_options`` options. Tried in order, each
    taking the *last* match: a letter inside ``\\boxed{}`` (``\\boxed{(C)}``, ``\\boxed{\\text{C}}``,
    ``\\boxed{C. text}``); "answer is (C)" / "Answer: C"; a letter alone on the last line that has one. Letters past
    the options are none.
    """
    return _option_letter(last_boxed(text), text, num_options)


def _option_letter(boxed: Optional[str], text: str, num_options: int) -> Optional[str]:
    """:func:`extract_option_letter` given the box content to read first and the text of the fallbacks."""
    letters = option_letters(num_options)
    if not letters:
        return None
    if boxed is not None:
        inner = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", boxed).strip()
        m = re.fullmatch(rf"\(?([{letters}])\)?(?:[.:)\s].*)?", inner, flags=re.S)
        if m:
            return m.group(1)
    phrase = re.findall(
        rf"(?:answer|option|choice)\s*(?:is|:)?\s*(?:option|choice)?\s*[:\s]*\(?\**(?-i:([{letters}]))\**\)?(?![A-Za-z])",
        text, flags=re.I)
    if phrase:
        return phrase[-1]
    for line in reversed(text.strip().splitlines()):
        line = line.strip().strip("*").strip()
        if not line:
            continue
        m = re.fullmatch(rf"\(?([{letters}])\)?[.:]?", line) or re.match(rf"\(([{letters}])\)", line)
        if m:
            return m.group(1)
    return None


def extract_answer(answer_type: str, text: str, num_options: int = 0, *, tool: bool = False) -> Optional[str]:
    """The answer of one completion for ``answer_type`` math, option or string (``None``: no answer): the last
    ``\\boxed{}``; for option, :func:`extract_option_letter`'s rules; for string, else the last non-empty line.

    Tool mode (``tool=True``): the box is the trajectory's final answer as training parses it
    (:func:`~unifiedplayers.feedback.trajectory.parse_transcript`), and the fallbacks read only the reasoning text
    (:func:`~unifiedplayers.feedback.trajectory.reasoning_text`), never what a program printed.
    """
    if tool:
        boxed, prose = parse_transcript("", text).final_answer, reasoning_text(text)
    else:
        boxed, prose = last_boxed(text), text
    if answer_type == "math":
        return boxed
    if answer_type == "option":
        return _option_letter(boxed, prose, num_options)
    if answer_type == "string":
        if boxed is not None:
            return boxed
        lines = [ln.strip() for ln in prose.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None
    raise ValueError(f"no answer extraction for answer type {answer_type!r}; known: math, option, string")


# ---- grading -------------------------------------------------------------------------------------

GRADERS = {"math": grade_math, "option": grade_option, "string": grade_string}


def grade(answer_type: str, prediction: Optional[str], reference: str) -> bool:
    """Grade one extracted answer; ``answer_type`` is one of ``GRADERS`` (``program`` is graded by tests)."""
    try:
        grader = GRADERS[answer_type]
    except KeyError:
        raise ValueError(f"no grader for answer type {answer_type!r}; known: {sorted(GRADERS)}") from None
    return grader(prediction, reference)
