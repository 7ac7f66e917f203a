"""Execution trajectories: the schema verifiers read (Appendix E.3, I.3), transcript parsing and rendering.

A :class:`Trajectory` is a ``question``, a list of :class:`Step` and a ``final_answer`` (``None`` when the
Execution player never answered). Transcript format (what :func:`parse_transcript` reads and :func:`render` writes)::

    reasoning text ...

    ```python
    print(1 + 1)
    ```

    ```output
    2
    ```

    The answer is \\boxed{2}.

- A fence labelled ``python``/``py``/``python3`` is a code step (lang "python"), any other language label a code
  step with that lang, ``output``/``stdout``/``observation`` an output step. An unlabelled fence is the output of
  the code step right before it when that has no output yet, else a python code step (models omit the label).
- An unterminated fence (generation cut off) runs to the end of the text.
- Text between fences is one reason step (stripped; blank text is no step). A trailing segment that is nothing but
  the boxed answer (optionally "Final answer:") is the answer, not a reasoning step.
- ``final_answer`` is the content of the last *balanced* ``\\boxed{...}`` (or ``\\fbox{...}``) in the reasoning
  text, nested braces kept (``\\boxed{\\frac{5}{2}}`` gives ``\\frac{5}{2}``); boxes in code or output are not answers.

For a parsed transcript ``parse_transcript(q, render(t)) == t``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

STEP_TYPES = ("reason", "code", "output")
PYTHON_LANG = "python"
OUTPUT_FENCE = "output"
PYTHON_LABELS = frozenset({"python", "py", "python3"})  # an unlabelled fence is python code too
_OUTPUT_LABELS = {"output", "stdout", "observation"}

# What the Evaluation player is told about its input (it never sees the expected answer).
TRAJECTORY_SCHEMA = """\
check(trajectory) receives an object with:
  trajectory.question      str: the task
  trajectory.steps         list of steps, in order; each step s has
      s.type               "reason", "code" or "output"
      s.text               reasoning text (reason steps; None otherwise)
      s.code, s.lang       the code and its language id, "python" (code steps; None otherwise)
      s.result             the observation the sandbox returned: stdout, then stderr and the exit
                           status if any (output steps; None otherwise)
  trajectory.final_answer  str: the content of the final \\boxed{}, or None if there is none
Return True (or (True, None)) to accept, (False, i) to reject with i the earliest failing step.
Only the Python standard library is available."""


@dataclass
class Step:
    """One step of a trajectory (Appendix F.1, I.3). Only the fields of its ``type`` are set."""

    type: str
    text: Optional[str] = None  # reason
    code: Optional[str] = None  # code
    lang: Optional[str] = None  # code: language id, "python"
    result: Optional[str] = None  # output: observation text

    def __post_init__(self) -> None:
        if self.type not in STEP_TYPES:
            raise ValueError(f"step type must be one of {STEP_TYPES}, got {self.type!r}")
        required = {"reason": "text", "code": "code", "output": "result"}[self.type]
        if getattr(self, required) is None:
            raise ValueError(f"a {self.type} step needs {required!r}")
        if self.type == "code" and self.lang is None:
            self.lang = PYTHON_LANG

    def to_dict(self) -> dict[str, Any]:
        # Every field, None where unused, so that a verifier reading s.result on a reason step gets None.
        return {"type": self.type, "text": self.text, "code": self.code, "lang": self.lang, "result": self.result}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Step":
        return cls(type=d["type"], text=d.get("text"), code=d.get("code"), lang=d.get("lang"), result=d.get("result"))


def reason_step(text: str) -> Step:
    return Step(type="reason", text=text)


def code_step(code: str, lang: str = PYTHON_LANG) -> Step:
    return Step(type="code", code=code, lang=lang)


def output_step(result: str) -> Step:
    return Step(type="output", result=result)


@dataclass
class Trajectory:
    """An Execution trajectory τ: question, steps and final answer (Appendix E.3, I.3)."""

    question: str
    steps: list[Step] = field(default_factory=list)
    final_answer: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        steps = [s.to_dict() for s in self.steps]
        return {"question": self.question, "steps": steps, "final_answer": self.final_answer}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        steps = [Step.from_dict(s) for s in d.get("steps", [])]
        return cls(question=d["question"], steps=steps, final_answer=d.get("final_answer"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "Trajectory":
        return cls.from_dict(json.loads(s))

    def copy(self) -> "Trajectory":
        return Trajectory.from_dict(self.to_dict())

    def render(self, include_question: bool = False) -> str:
        return render(self, include_question=include_question)


def answer_sentence(answer: str) -> str:
    """A sentence that states ``answer`` as Execution trajectories end, so it parses as (part of) a reasoning step,
    not as an answer-only segment."""
    return f"So the answer is \\boxed{{{answer}}}."


def state_answer(traj: Trajectory, answer: str) -> None:
    """End ``traj`` (in place) with :func:`answer_sentence` and make ``answer`` its final answer: a new reasoning step
    after a code or output step, else appended to the last reasoning step (a parsed transcript never holds two in a
    row), so that ``parse_transcript(traj.question, render(traj)) == traj`` still holds if it held before."""
    sentence = answer_sentence(answer)
    last = traj.steps[-1] if traj.steps else None
    if last is not None and last.type == "reason" and (last.text or "").strip():
        last.text = f"{last.text}\n\n{sentence}"
    else:
        traj.steps.append(reason_step(sentence))
    traj.final_answer = answer


# ---------------------------------------------------------------------------------------------------
# \boxed{...} extraction


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its matching ``}``, in one pass (``\\{`` and ``\\}`` are literal)."""
    pairs, stack, i, n = {}, [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _balanced_content(text: str, open_idx: int) -> Optional[tuple[str, int]]:
    """Content of the brace group opening at ``text[open_idx] == "{"`` and the index after it."""
    close = _matching_braces(text[open_idx:]).get(0)
    return None if close is None else (text[open_idx + 1 : open_idx + close], open_idx + close + 1)


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every balanced \\boxed{...} / \\fbox{...} in ``text`` (linear time)."""
    pairs = _matching_braces(text)
    spans = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        close = pairs.get(m.end() - 1)
        if close is not None:
            spans.append((m.start(), close + 1, text[m.end() : close]))
    return spans


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last balanced ``\\boxed{...}`` in ``text`` (nested braces kept), stripped."""
    spans = _boxed_spans(text)
    return spans[-1][2].strip() if spans else None


_ANSWER_ONLY = re.compile(
    r"^\s*(?:[*_#]*\s*final answer\s*[*_]*\s*[:.]?\s*[*_]*\s*)?\$*\s*\\(?:boxed|fbox)\s*\{", re.IGNORECASE
)


def _is_answer_only(segment: str) -> bool:
    """True when ``segment`` is nothing but one boxed answer (e.g. "Final answer: $\\boxed{9}$.")."""
    m = _ANSWER_ONLY.match(segment)
    if not m:
        return False
    got = _balanced_content(segment, m.end() - 1)
    return got is not None and re.fullmatch(r"\s*\$*\s*\.?\s*", segment[got[1] :]) is not None


# ---------------------------------------------------------------------------------------------------
# Parsing

# A fence is a line of its own; the tool loop reads fences by the same rules.
FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*$", re.MULTILINE)
FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)


def parse_transcript(question: str, text: str) -> Trajectory:
    """Split an Execution transcript into reason / code / output steps and its final answer. Never raises on model
    text: anything that is not a well-formed fence is reasoning (``None``, a failed generation, is empty)."""
    steps, reason_segments = _scan(text)
    final_answer = None
    for seg in reversed(reason_segments):
        final_answer = extract_boxed(seg)
        if final_answer is not None:
            break
    return Trajectory(question=question, steps=steps, final_answer=final_answer)


def reasoning_text(text: str) -> str:
    """The text of a transcript outside code and output fences (reason steps and the answer-only tail), joined by
    blank lines: what an answer may be read from in tool mode."""
    return "\n\n".join(_scan(text)[1])


def _scan(text: str) -> tuple[list[Step], list[str]]:
    """(steps, reasoning segments in order) of a transcript."""
    text = "" if text is None else str(text)
    steps: list[Step] = []
    reason_segments: list[str] = []
    pos = 0

    def add_reason(segment: str) -> None:
        seg = segment.strip()
        if seg:
            reason_segments.append(seg)
            steps.append(reason_step(seg))

    while True:
        m = FENCE_OPEN.search(text, pos)
        if m is None:
            break
        add_reason(text[pos : m.start()])
        label = m.group(1).lower()
        body_start = m.end() + 1 if m.end() < len(text) else m.end()
        close = FENCE_CLOSE.search(text, body_start)
        if close is None:
            body, pos = text[body_start:], len(text)
        else:
            body_end = close.start() - 1 if close.start() > body_start else close.start()
            body, pos = text[body_start:body_end], close.end()
        if label in _OUTPUT_LABELS or (label == "" and steps and steps[-1].type == "code"):
            steps.append(output_step(body))
        else:
            steps.append(code_step(body, PYTHON_LANG if label in PYTHON_LABELS or label == "" else label))
    tail = text[pos:].strip()
    if tail and _is_answer_only(tail):
        reason_segments.append(tail)  # holds the answer but is not a reasoning step
    else:
        add_reason(tail)
    return steps, reason_segments


# ---------------------------------------------------------------------------------------------------
# Rendering


def render_step(step: Step) -> str:
    if step.type == "reason":
        return step.text or ""
    if step.type == "code":
        return f"```{step.lang or PYTHON_LANG}\n{step.code}\n```"
    return f"```{OUTPUT_FENCE}\n{step.result}\n```"


def render(traj: Trajectory, include_question: bool = False) -> str:
    """``traj`` as transcript text; ``\\boxed{final_answer}`` is appended unless the last step already boxes it."""
    parts = [f"Question: {traj.question}"] if include_question else []
    parts += [render_step(s) for s in traj.steps]
    if traj.final_answer is not None:
        last = traj.steps[-1] if traj.steps else None
        already = last is not None and last.type == "reason" and extract_boxed(last.text or "") == traj.final_answer
        if not already:
            parts.append(f"\\boxed{{{traj.final_answer}}}")
    return "\n\n".join(parts)


def format_observation(stdout: str, stderr: str = "", exit_code: Optional[int] = 0, timed_out: bool = False,
                       memory_exceeded: bool = False) -> str:
    """An output step's ``result``: stdout alone for a clean run (so ``result.strip()`` is the printed value, as the
    paper's Verifier 1.2 expects); stderr and a non-zero exit status are appended on their own lines."""
    parts = [stdout.rstrip("\n")] if stdout else []
    if stderr.strip():
        parts.append("[stderr]\n" + stderr.rstrip("\n"))
    if timed_out:
        parts.append("[timed out]")
    elif memory_exceeded:
        parts.append("[memory limit exceeded]")
    elif exit_code not in (0, None):
        parts.append(f"[exit status {exit_code}]")
    return "\n".join(parts)
