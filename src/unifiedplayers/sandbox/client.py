"""The host side of the sandbox: starts the fork server and turns calls into results."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from unifiedplayers.sandbox.config import SandboxConfig

_SERVER = Path(__file__).with_name("_server")  # a package run by path (its __main__)
UID_LOCK_DIRS = ("/run/lock", "/dev/shm", "/tmp")


def uid_lock_root(dirs: Sequence[str] = UID_LOCK_DIRS) -> str:
    """The one folder per machine (whatever ``TMPDIR`` says: the uids belong to the machine) in which every sandbox
    server of this user locks its block of per-call uids. Refuses a folder another user owns or can write."""
    for base in dirs:
        if not (os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK)):
            continue
        path = os.path.join(base, f"unifiedplayers-sandbox-uids-{os.geteuid()}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return path
    raise SandboxError(f"no folder to lock the sandbox's uids in: none of {', '.join(dirs)} is writable and ours")


class SandboxError(RuntimeError):
    """The sandbox could not start (not raised for anything the sandboxed code does)."""


@dataclass
class ExecResult:
    """Outcome of running a program (``Sandbox.run``)."""

    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal (-9 after a timeout)
    timed_out: bool = False
    memory_exceeded: bool = False
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_exceeded: bool = False  # killed for flooding its output far past the truncation size
    error: Optional[str] = None  # set when the call failed for a reason of the sandbox itself

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class CallResult:
    """Outcome of calling a function defined in untrusted source (``Sandbox.call``)."""

    ok: bool  # the function returned a JSON-serializable value without raising
    value: Any = None  # the JSON-decoded return value (tuples come back as lists)
    error: Optional[str] = None
    timed_out: bool = False
    duration_s: float = 0.0
    memory_exceeded: bool = False
    stdout: str = ""
    stderr: str = ""
    traceback: Optional[str] = None


@dataclass
class _Request:
    message: dict  # what the server is sent, but the id
    error: Optional[str] = None  # why this request cannot be sent: it fails as such, without running


def _frame(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def _unsendable(**texts: str) -> Optional[str]:
    """Why one of ``texts`` cannot cross as UTF-8 (a lone surrogate, ``"\\ud800"``, would stop the server), or None."""
    for name, text in texts.items():
        if not text.isascii():
            try:
                text.encode("utf-8", errors="surrogateescape")
            except UnicodeEncodeError as exc:
                return f"the {name.replace('_', ' ')} cannot be sent to the sandbox: {exc}"
    return None


def _message(kind: str, timeout_s: Optional[float], seed: int = 0, **fields: str) -> dict:
    """``seed``: the call's random seed and clock offset (sandbox.deterministic)."""
    message = {"kind": kind, **fields}
    if timeout_s is not None:
        message["timeout_s"] = float(timeout_s)
    if seed:
        message["seed"] = seed
    return message


def _run_request(code: Any, timeout_s: Optional[float], seed: int = 0) -> _Request:
    code = str(code)
    return _Request(_message("run", timeout_s, int(seed), code=code), _unsendable(code=code))


def _call_request(source: Any, function: Any, payload: Any, timeout_s: Optional[float]) -> _Request:
    """A call's request; one whose argument JSON cannot hold fails as such, never an exception here."""
    source, function = str(source), str(function)
    try:
        text = json.dumps(payload)
    except Exception as exc:  # noqa: BLE001 - TypeError, ValueError, RecursionError, or a container's own
        return _Request({}, f"argument is not JSON-serializable: {exc}")
    return _Request(_message("call", timeout_s, source=source, function=function, payload=text),
                    _unsendable(source=source, function_name=function))


class Sandbox:
    """Runs untrusted Python under the isolation of Appendix D.3, warm and in parallel (docs/sandbox.md). The server
    starts lazily and restarts if it dies; calls from several threads are serialised batch by batch."""

    def __init__(self, config: Optional[SandboxConfig] = None, **overrides: Any):
        cfg = config if config is not None else SandboxConfig()
        if not isinstance(cfg, SandboxConfig):  # a DictConfig or a plain mapping from Hydra
            cfg = SandboxConfig(**dict(cfg))
        self.config = replace(cfg, **overrides) if overrides else cfg
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._stderr_file = None
        self._workroot: Optional[str] = None
        self.isolation: dict = {}
        self.restarts = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass

    def start(self) -> None:
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop_server()
        base = self.config.workdir_root or tempfile.gettempdir()
        parent = os.path.join(base, f"unifiedplayers-sandbox-{os.geteuid()}")
        os.makedirs(parent, mode=0o755, exist_ok=True)
        st = os.stat(parent)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SandboxError(f"{parent} must be owned by uid {os.geteuid()} and not group/other-writable")
        self._workroot = tempfile.mkdtemp(prefix="calls-", dir=parent)
        settings = asdict(self.config)
        settings["workdir_root"] = self._workroot
        settings["mirror_root"] = parent
        settings["uid_lock_root"] = uid_lock_root() if os.geteuid() == 0 else None
        self._stderr_file = tempfile.TemporaryFile()
        # LD_BIND_NOW: symbols resolved at start-up, not in each call's fork (a copy-on-write fault each); the
        # forkers clear the environment. PYTHONHASHSEED: one str hash in every run (docs/sandbox.md); -E would
        # drop it, so isolated mode is spelt out: -P -s -S and an environment with no other PYTHON* variable.
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LD_BIND_NOW": "1",
               "PYTHONHASHSEED": "0" if self.config.deterministic else "random"}
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-s", "-S", str(_SERVER)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr_file,
            env=env, cwd="/", close_fds=True, start_new_session=True,
        )
        self._write(settings)
        hello = self._read()
        if hello is None or not hello.get("ready"):
            err = (hello or {}).get("error") or self._server_stderr() or "no answer"
            self._stop_server()
            raise SandboxError(f"sandbox server failed to start: {err}")
        self.isolation = hello["isolation"]

    def close(self) -> None:
        with self._lock:
            self._stop_server()

    def _stop_server(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None
        if self._workroot and os.path.isdir(self._workroot):
            shutil.rmtree(self._workroot, ignore_errors=True)
        self._workroot = None

    def _server_stderr(self) -> str:
        if self._stderr_file is None:
            return ""
        self._stderr_file.seek(0)
        return self._stderr_file.read()[-4000:].decode(errors="replace")

    # -- framing -------------------------------------------------------------------------------
    def _write(self, obj: dict) -> None:
        self._proc.stdin.write(_frame(obj))
        self._proc.stdin.flush()

    def _read(self) -> Optional[dict]:
        hdr = self._proc.stdout.read(4)
        if len(hdr) < 4:
            return None
        (n,) = struct.unpack(">I", hdr)
        body = self._proc.stdout.read(n)
        if len(body) < n:
            return None
        return json.loads(body)

    # -- calls ---------------------------------------------------------------------------------
    def _submit(self, requests: Sequence[_Request]) -> list[dict]:
        """The answers to ``requests``, in order; those that cannot be sent fail without running."""
        answers = iter(self._send(r for r in requests if r.error is None))
        return [next(answers) if r.error is None else
                {"exit_code": -9, "ok": False, "stdout": "", "stderr": "", "error": r.error} for r in requests]

    def _send(self, requests: Iterable[_Request]) -> list[dict]:
        requests = list(requests)
        if not requests:
            return []
        with self._lock:
            self._ensure_started()
            ids = []
            frames = []
            for r in requests:
                self._next_id += 1
                ids.append(self._next_id)
                frames.append(_frame({"id": self._next_id, **r.message}))
            proc = self._proc

            def writer() -> None:  # a thread, so a large batch cannot deadlock on full pipes
                try:
                    for f in frames:
                        proc.stdin.write(f)
                    proc.stdin.flush()
                except (OSError, ValueError):  # the server died: the answers that never come say so
                    pass

            t = threading.Thread(target=writer, daemon=True)
            t.start()
            results: dict[int, dict] = {}
            while len(results) < len(ids):
                msg = self._read()
                if msg is None:
                    break
                results[msg["id"]] = msg
            t.join()
            if len(results) < len(ids):
                # The server died (it never should); whatever was in flight is a recorded failure.
                detail = self._server_stderr()[-500:]
                self._stop_server()
                self.restarts += 1
                for i in ids:
                    results.setdefault(i, {"id": i, "exit_code": -9, "ok": False, "stdout": "", "stderr": "",
                                           "error": f"sandbox server died; restarted. {detail}".strip()})
            return [results[i] for i in ids]

    @staticmethod
    def _exec_result(m: dict) -> ExecResult:
        return ExecResult(
            stdout=m.get("stdout", ""), stderr=m.get("stderr", ""), exit_code=int(m.get("exit_code", -9)),
            timed_out=bool(m.get("timed_out")), memory_exceeded=bool(m.get("memory_exceeded")),
            duration_s=float(m.get("duration_s", 0.0)), stdout_truncated=bool(m.get("stdout_truncated")),
            stderr_truncated=bool(m.get("stderr_truncated")), output_exceeded=bool(m.get("output_exceeded")),
            error=m.get("error"),
        )

    @staticmethod
    def _call_result(m: dict) -> CallResult:
        ok = bool(m.get("ok"))
        value, error = None, m.get("error")
        if ok:
            try:
                value = json.loads(m["value"])
            except (KeyError, ValueError, RecursionError) as exc:
                ok, error = False, f"undecodable return value: {exc}"
        return CallResult(
            ok=ok, value=value, error=None if ok else (error or "call failed"), timed_out=bool(m.get("timed_out")),
            duration_s=float(m.get("duration_s", 0.0)), memory_exceeded=bool(m.get("memory_exceeded")),
            stdout=m.get("stdout", ""), stderr=m.get("stderr", ""), traceback=m.get("traceback"),
        )

    def run(self, code: str, timeout_s: Optional[float] = None) -> ExecResult:
        """Run ``code`` as a program; its stdout, stderr and exit status come back."""
        return self.run_many([code], timeout_s=timeout_s)[0]

    def run_many(self, codes: Iterable[str], timeout_s: Optional[float] = None,
                 seeds: Optional[Iterable[int]] = None) -> list[ExecResult]:
        """Run programs in parallel over the machine's cores; results in input order. ``seeds``: one per program,
        its random seed and clock offset in seconds (default 0; docs/sandbox.md)."""
        codes = list(codes)
        seeds = [0] * len(codes) if seeds is None else list(seeds)
        if len(seeds) != len(codes):
            raise ValueError(f"{len(seeds)} seeds for {len(codes)} programs")
        reqs = [_run_request(c, timeout_s, seed) for c, seed in zip(codes, seeds)]
        return [self._exec_result(m) for m in self._submit(reqs)]

    def call(self, source: str, function: str, payload: Any = None, timeout_s: Optional[float] = None) -> CallResult:
        """Define ``source`` in a fresh module, then return ``function(payload)`` (JSON in, JSON out)."""
        return self.call_many([(source, function, payload)], timeout_s=timeout_s)[0]

    def call_many(self, items: Iterable[tuple[str, str, Any]], timeout_s: Optional[float] = None) -> list[CallResult]:
        """Parallel ``call`` over ``(source, function, payload)`` triples; results in input order."""
        reqs = [_call_request(s, f, p, timeout_s) for s, f, p in items]
        return [self._call_result(m) for m in self._submit(reqs)]


def naive_run(code: str, timeout_s: float = 10.0) -> ExecResult:
    """The benchmarks' baseline: one fresh ``python3 -c`` per program, with no isolation at all."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout_s, env={"PATH": "/usr/bin:/bin"})
        return ExecResult(p.stdout, p.stderr, p.returncode, duration_s=time.perf_counter() - t0)
    except subprocess.TimeoutExpired as exc:
        return ExecResult(str(exc.stdout or ""), str(exc.stderr or ""), -9, timed_out=True,
                          duration_s=time.perf_counter() - t0)
