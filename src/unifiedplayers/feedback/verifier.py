"""Executable verifiers written by the Evaluation player (§3.2; Appendix B.1, E.3, I.3).

1. :func:`compile_verifier` keeps the last fenced python block of the player's output and decides validity
   *without running it*: it parses, compiles, and defines a top-level ``check`` callable with one argument.
2. :func:`sandbox_source` prepends a pure-stdlib prelude that turns the JSON payload (``Trajectory.to_dict()``)
   into an object with attribute (and item) access, then calls the model's ``check``.
3. :func:`outcome_of` reads the sandbox's ``CallResult``: only ``True`` or an exact ``tuple`` (not a namedtuple)
   whose first element is ``True`` accepts; ``False`` or such a tuple starting with ``False`` rejects (decided by
   identity in the prelude). A raise, a timeout, or any other value (``1``, ``"True"``, ``None``) is an *error*
   (:data:`ERROR_KINDS`): 0 in the verdict matrix like a rejection (Eq. 10), but recorded apart from one.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Optional

from unifiedplayers.feedback.trajectory import PYTHON_LABELS

CHECK_NAME = "check"
ENTRY_POINT = "__unifiedplayers_verdict__"  # the function the sandbox calls (defined in the prelude)

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class CompiledVerifier:
    """Result of :func:`compile_verifier`: ``source`` is the extracted code (None if there was none)."""

    valid: bool
    reason: str
    source: Optional[str]


_UNTERMINATED = re.compile(
    r"^[ \t]*```[ \t]*(python|py|python3)?[ \t]*\n(.*)\Z", re.MULTILINE | re.DOTALL | re.IGNORECASE
)


def extract_python_block(text: str) -> Optional[str]:
    """The last fenced python (or unlabelled) block of ``text``; a python fence left open at the end runs to the
    end, and a text without any fence is taken whole (bare code)."""
    matches = list(_FENCE.finditer(text))
    tail = _UNTERMINATED.search(text, matches[-1].end() if matches else 0)
    if tail is not None and "```" not in tail.group(2):
        return tail.group(2)
    blocks = [m.group(2) for m in matches if m.group(1).lower() in PYTHON_LABELS | {""}]
    if blocks:
        return blocks[-1]
    return None if "```" in text else text


def _check_signature_ok(fn: ast.FunctionDef | ast.Lambda) -> bool:
    """True when ``fn`` can be called with exactly one positional argument."""
    a = fn.args
    positional = a.posonlyargs + a.args
    required = len(positional) - len(a.defaults)
    kw_required = any(d is None for d in a.kw_defaults)
    return not kw_required and required <= 1 and (len(positional) >= 1 or a.vararg is not None)


def compile_verifier(text: str) -> CompiledVerifier:
    """Validity of one Evaluation output, decided statically (parse, compile, top-level ``check``)."""
    if not isinstance(text, str):
        return CompiledVerifier(False, f"not text: {type(text).__name__}", None)
    source = extract_python_block(text)
    if source is None or not source.strip():
        return CompiledVerifier(False, "no python code block", source)
    try:
        tree = ast.parse(source)
        compile(tree, "<verifier>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return CompiledVerifier(False, f"does not compile: {type(e).__name__}: {e}", source)
    reserved = sorted(n for n in _RESERVED if n in source)
    if reserved:
        return CompiledVerifier(False, f"uses a name reserved for the harness: {reserved[0]}", source)
    check_def: Any = None
    functions: dict[str, Any] = {}
    for node in tree.body:  # the last top-level binding of `check` is the one that counts
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
            if node.name == CHECK_NAME:
                check_def = node
        elif isinstance(node, ast.AsyncFunctionDef) and node.name == CHECK_NAME:
            check_def = "async"
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == CHECK_NAME for t in node.targets):
            if isinstance(node.value, ast.Lambda):
                check_def = node.value
            elif isinstance(node.value, ast.Name) and node.value.id in functions:  # check = verify
                check_def = functions[node.value.id]
            else:
                check_def = "other"
    problems = {None: "defines no top-level check", "async": "check is a coroutine function",
                "other": "check is bound to something other than a function"}
    if check_def is None or isinstance(check_def, str):
        return CompiledVerifier(False, problems[check_def], source)
    if not _check_signature_ok(check_def):
        return CompiledVerifier(False, "check cannot be called with one argument (the trajectory)", source)
    return CompiledVerifier(True, "ok", source)


# The prelude imports nothing (an import costs a file lookup per call). Its builtins are captured as default
# arguments, so a verifier that rebinds `type` or `len` at module level cannot change how its result is read.
PRELUDE = '''\
class _UpView(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def __unifiedplayers_verdict__(payload, _g=globals(), _type=type, _tuple=tuple, _len=len, _repr=repr, _int=int,
                               _view=_UpView):
    view = _view(payload)
    view["steps"] = [_view(s) for s in payload.get("steps") or []]
    result = _g["check"](view)
    accepted = result is True or (_type(result) is _tuple and _len(result) >= 1 and result[0] is True)
    rejected = result is False or (_type(result) is _tuple and _len(result) >= 1 and result[0] is False)
    is_pair = (_type(result) is _tuple and _len(result) >= 2 and _type(result[1]) is _int
               and -(1 << 63) <= result[1] < 1 << 63)  # an int JSON can carry (not past the 4300-digit str limit)
    try:
        shown = _repr(result)[:200]
    except BaseException:
        shown = "<unprintable>"
    return {"accepted": accepted, "rejected": rejected, "returned": _type(result).__name__, "repr": shown,
            "fail_step": result[1] if is_pair else None}


# ---- verifier ----
'''
_RESERVED = (ENTRY_POINT, "_UpView")  # the prelude's names: a verifier may not rebind them


def sandbox_source(source: str) -> str:
    """The program the sandbox runs for one verifier: prelude, then the model's code."""
    return PRELUDE + source + "\n"


ERROR_KINDS = ("raised", "timeout", "bad_return")  # outcomes that are not a verdict of the check


@dataclass(frozen=True)
class CheckOutcome:
    """One verdict v_i(τ): ``accepted`` and, for a rejection or an error, why."""

    accepted: bool
    kind: str  # accepted | rejected (returned a failing verdict) | raised | timeout | bad_return
    reason: str
    fail_step: Optional[int] = None
    duration_s: float = 0.0

    @property
    def is_error(self) -> bool:
        """The check raised, timed out or returned junk: no verdict (Z counts it as 0)."""
        return self.kind in ERROR_KINDS


def _text(reason: str) -> str:
    """``reason`` with lone surrogates (from a model's ``repr`` or exception) escaped, so its record can be written."""
    try:
        reason.encode("utf-8")
        return reason
    except UnicodeEncodeError:
        return reason.encode("utf-8", "backslashreplace").decode("utf-8")


def outcome_of(call: Any) -> CheckOutcome:
    """Read a sandbox ``CallResult`` of :data:`ENTRY_POINT` as a verdict."""
    duration = float(getattr(call, "duration_s", 0.0) or 0.0)
    if getattr(call, "timed_out", False):
        return CheckOutcome(False, "timeout", "check timed out", None, duration)
    if not call.ok:
        # The traceback's last line names the exception (stderr); ``error`` says how the call ended.
        error = (call.error or "unknown error").strip()
        tb = (getattr(call, "traceback", None) or getattr(call, "stderr", "") or "").strip()
        detail = tb.splitlines()[-1] if tb else ""
        reason = f"check failed: {error}" + (f" ({detail})" if detail and detail not in error else "")
        return CheckOutcome(False, "raised", _text(reason)[:500], None, duration)
    value = call.value
    if not isinstance(value, dict) or "accepted" not in value:
        return CheckOutcome(False, "bad_return", f"malformed verdict {value!r:.200}", None, duration)
    fail_step = value.get("fail_step") if isinstance(value.get("fail_step"), int) else None
    if value["accepted"] is True:
        return CheckOutcome(True, "accepted", "accepted", fail_step, duration)
    returned, shown = value.get("returned"), value.get("repr")
    if value.get("rejected") is True:  # the prelude's reading: False, or an exact tuple whose first item is False
        return CheckOutcome(False, "rejected", _text(f"check returned {shown}"), fail_step, duration)
    reason = f"check returned {returned} {shown}; only True or (True, ...) accepts"
    return CheckOutcome(False, "bad_return", _text(reason), fail_step, duration)
