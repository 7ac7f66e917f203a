"""The guarded sympy equivalence check behind U(q)'s answer matching (§3.2, below Eq. 2): math-verify (sympy) in a
child process that is killed when it exceeds its time; :func:`unifiedplayers.feedback.rewards.answer_clusters`
goes through :data:`_GUARD` and groups by text (:func:`_text_clusters`) when the guard gives no answer.

It is a process of its own because sympy evaluates a short answer such as 9^{9^{9^{9}}} for ever and
math-verify's own timeouts rely on signals, which fail outside the main thread; a killed child costs one restart
(about a second). The budget is the child's CPU time (:func:`process_cpu_seconds`), so that U(q) does not depend on
the machine's load. A plain subprocess (not multiprocessing), so that no caller's ``__main__`` is re-imported.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any, Optional, Sequence


class _DropTimeoutNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_ANSWER_PARSE_MAX_CHARS = 200  # longer answers are compared as text: sympy on long input can hang


def _parse_answer(answer: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if len(answer) > _ANSWER_PARSE_MAX_CHARS:
        return []
    try:
        # Timeouts off: math-verify's signal-based timeout fails outside the main thread.
        return parse(f"${answer}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                     parsing_timeout=None)
    except Exception:
        return []


def _equivalent(a: str, pa: list, b: str, pb: list) -> bool:
    from math_verify import verify

    if " ".join(a.split()) == " ".join(b.split()):
        return True
    if not pa or not pb:
        return False
    try:
        return bool(verify(pa, pb, timeout_seconds=None) or verify(pb, pa, timeout_seconds=None))
    except Exception:
        return False


def _math_clusters(answers: Sequence[Optional[str]]) -> list[list[int]]:
    """The clustering itself (in whatever process runs it)."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutNotice) for f in logger.filters):
            logger.addFilter(_DropTimeoutNotice())
    clusters: list[list[int]] = []
    reps: list[tuple[str, list]] = []
    for idx, ans in enumerate(answers):
        if ans is None or not ans.strip():
            continue
        a = ans.strip()
        pa = _parse_answer(a)
        for cluster, (b, pb) in zip(clusters, reps):
            if _equivalent(a, pa, b, pb):
                cluster.append(idx)
                break
        else:
            clusters.append([idx])
            reps.append((a, pa))
    return clusters


def _text_clusters(answers: Sequence[Optional[str]]) -> list[list[int]]:
    """Fallback: answers equal up to whitespace."""
    groups: dict[str, list[int]] = {}
    for idx, ans in enumerate(answers):
        if ans is not None and ans.strip():
            groups.setdefault(" ".join(ans.split()), []).append(idx)
    return list(groups.values())


def _serve_stdio() -> None:  # pragma: no cover - runs in the guard process
    """The guard process: one JSON list of answers per line in, one JSON list of clusters per line out."""
    try:
        import resource

        cap = 4 << 30  # a runaway sympy evaluation fails with MemoryError instead of exhausting the host
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass
    out = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # nothing a library prints can corrupt the replies
    try:  # import the matcher before saying ready: its start-up is not charged to the first request
        _math_clusters(["1", "1"])
    except Exception:  # noqa: BLE001 - the requests fail the same way and fall back
        pass
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            reply = _math_clusters(json.loads(line))
        except Exception:  # noqa: BLE001 - any failure: the caller falls back to text matching
            reply = None
        out.write(json.dumps(reply) + "\n")
        out.flush()


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used, all its threads (its CPU-time clock, as clock_getcpuclockid gives
    it); ``inf`` once it is gone, so that a wait on it ends."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        return float("inf")


class _ClusterGuard:
    """Runs math-verify in a child process that is killed when it exceeds its time (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Any = None
        self._pid = 0

    startup_timeout_s = 120.0  # importing sympy and math-verify: seconds on a quiet machine, more under load
    wall_factor = 3.0  # a request is also abandoned after this many times its CPU budget of wall clock

    def _start(self) -> bool:
        """Start the guard and wait until it has imported its matcher (not part of any request's time)."""
        code = "from unifiedplayers.feedback.sympy_guard import _serve_stdio; _serve_stdio()"
        env = dict(os.environ, PYTHONHASHSEED="0")  # sympy iterates sets: one order in every run
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, close_fds=True, env=env)
        self._pid = os.getpid()
        if self._read_line(time.monotonic() + self.startup_timeout_s) != b"ready\n":
            self._stop()
            return False
        return True

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc = None

    def _read_line(self, deadline: float, cpu_limit: Optional[float] = None) -> Optional[bytes]:
        """The guard's next line, or None once the wall clock reaches ``deadline`` (monotonic) or the guard's own
        CPU clock reaches ``cpu_limit`` (seconds; :func:`process_cpu_seconds`)."""
        buf = b""
        fd = self._proc.stdout.fileno()
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if cpu_limit is not None:
                left = min(left, cpu_limit - process_cpu_seconds(self._proc.pid))
            if left <= 0:
                return None
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            buf += chunk
        return buf

    def clusters(self, answers: list[Optional[str]], timeout_s: float) -> Optional[list[list[int]]]:
        with self._lock:
            if self._pid != os.getpid():  # a forked copy of this process: the child is the parent's
                self._proc = None
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                if not self._start():
                    return None
            try:
                self._proc.stdin.write(json.dumps(answers).encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:
                self._stop()
                return None
            # CPU time decides (module docstring); the wall-clock cap only guards against a guard that stalls.
            cpu_limit = process_cpu_seconds(self._proc.pid) + timeout_s
            line = self._read_line(time.monotonic() + self.wall_factor * timeout_s, cpu_limit)
            if line is None:
                self._stop()
                return None
            return json.loads(line)

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._stop()
            self._proc = None


_GUARD = _ClusterGuard()
atexit.register(_GUARD.close)
