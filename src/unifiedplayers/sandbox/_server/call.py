"""One call: the forked process that runs untrusted code (:func:`call_process`), and the JSON it reads and writes."""
import builtins
import json
import os
import resource
import signal
import sys
import traceback

from .clock import deterministic_call
from .framing import KIND_CALL, KIND_RUN, RESULT_VALUE, write_all
from .kernel import PR_SET_PDEATHSIG, libc, set_rlimit
from .landlock import Landlock

# A call's JSON goes through the C scanner and encoder built here once: json.loads/dumps would run Python layers
# first, each object they touch a copy-on-write fault in a fresh fork. Same text in, same values out.
_JSON_SCAN = json.JSONDecoder().scan_once
_JSON_DEFAULT = json.JSONEncoder().default  # raises TypeError("Object of type X is not JSON serializable")
_c_make_encoder = json.encoder.c_make_encoder
_encode_ascii = json.encoder.encode_basestring_ascii


def json_loads(text):
    """``json.loads(text)`` of a well-formed document (the client's ``json.dumps`` of the argument)."""
    try:
        value, end = _JSON_SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # raises json's own error
    return value if end == len(text) else json.loads(text)


def json_dumps(value):
    """``json.dumps(value)`` with its default settings (ensure_ascii, allow_nan, circular check)."""
    return "".join(_c_make_encoder({}, _JSON_DEFAULT, _encode_ascii, None, ": ", ", ", False, False, True)(value, 0))


HERE = os.path.dirname(os.path.abspath(__file__))  # the server's own frames come from this folder


def _user_traceback(exc):
    """The traceback of the user's code only: the server's own frames (and its path) are left out."""
    te = traceback.TracebackException.from_exception(exc)
    stack = [f for f in te.stack if os.path.dirname(f.filename) != HERE]
    te.stack = traceback.StackSummary.from_list(stack)
    return "".join(te.format())


def call_process(kind, text, code, function, payload, timeout, forker, workdir, out_w, err_w, res_w, null_fd,
                  ruleset, seed=0):
    """Runs in the fork of a cell's forker; never returns. ``text``: the program or the source; ``code``: the source
    compiled by the forker (None: compile it here); ``payload``: the argument as JSON bytes."""
    try:
        os.setsid()  # its own session and process group
        if not forker.contained:
            # Contained, a call dies with its forker's sweep or namespace; otherwise by this signal.
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(null_fd, 0)
        os.dup2(res_w, 3)
        os.chdir(workdir)  # HOME and TMPDIR already name it (see Forker.work)
        if ruleset is not None:
            Landlock.restrict(ruleset, no_new_privs=False)  # a nested domain: no signals to the forker
        os.closerange(4, 1 << 16)
        set_rlimit(resource.RLIMIT_CPU, int(timeout) + 2)  # a backstop: the forker's watch ends it first
        deterministic_call(forker.deterministic, seed)
    except BaseException:  # noqa: BLE001 - never run untrusted code with a layer missing
        try:
            os.write(2, ("sandbox setup failed: " + traceback.format_exc()[-2000:]).encode())
        finally:
            os._exit(70)
    out = {"exit_code": 0, "memory_exceeded": False}
    try:
        if kind == KIND_RUN:
            glb = {"__name__": "__main__", "__builtins__": builtins}
            exec(compile(text, "<sandbox>", "exec"), glb)
        else:
            glb = {"__name__": "__sandbox__", "__builtins__": builtins}
            exec(code if code is not None else compile(text, "<source>", "exec"), glb)
            fn = glb.get(function)
            if not callable(fn):
                raise NameError("no function named %r is defined" % function)
            value = fn(json_loads(payload.decode("utf-8", errors="surrogateescape")))
            try:
                out["value"] = json_dumps(value)
            except (TypeError, ValueError) as exc:
                raise TypeError("return value is not JSON-serializable: %s" % exc) from None
            out["ok"] = True
    except SystemExit as exc:
        code = exc.code
        out["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        if kind == KIND_CALL:
            out["ok"], out["error"] = False, "SystemExit(%r)" % (code,)
    except MemoryError:
        out.update(exit_code=1, memory_exceeded=True, ok=False)
        out["error"] = "MemoryError: the call exceeded its %d MB memory cap" % forker.memory_mb
        print(out["error"], file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - anything the code raises is its failure
        try:
            tb = _user_traceback(exc)
        except MemoryError:
            tb = repr(exc)
        print(tb, file=sys.stderr, end="")
        out.update(exit_code=1, ok=False, error="%s: %s" % (type(exc).__name__, exc), traceback=tb[-4000:])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a broken stream must not lose the result
        pass
    try:
        if out.get("ok") and out["exit_code"] == 0 and not out["memory_exceeded"] and len(out) == 4:
            write_all(3, RESULT_VALUE + out["value"].encode("utf-8", errors="surrogateescape"))
        else:
            write_all(3, json.dumps(out).encode())
    except BaseException:  # noqa: BLE001
        pass
    code = out["exit_code"]
    os._exit(code & 0xFF if isinstance(code, int) and code >= 0 else 1)
