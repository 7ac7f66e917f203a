"""The client's view of one finished call (:func:`build_result`), from what the server read of its three pipes."""
import json
import os
import signal

from .framing import ENDED, KILLED, RESULT_VALUE, TIMED_OUT


def build_result(req, limit, value_limit, bufs, totals, status, how, duration, timeout):
    """``bufs``: what was kept of stdout, stderr and the result pipe; ``totals``: the bytes each carried."""
    (out, err, res), (out_total, err_total, res_total) = bufs, totals
    result = {
        "stdout": out.decode("utf-8", errors="replace"),
        "stderr": err.decode("utf-8", errors="replace"),
        "stdout_truncated": out_total > limit,
        "stderr_truncated": err_total > limit,
        "timed_out": how == TIMED_OUT,
        "output_exceeded": how == KILLED,
        "duration_s": duration,
        "memory_exceeded": False,
    }
    result["exit_code"] = exit_code = -signal.SIGKILL if how != ENDED else os.waitstatus_to_exitcode(status)
    if exit_code == 70 and "sandbox setup failed" in result["stderr"]:
        result["error"] = result["stderr"][-1000:]
    info = None
    if res[:1] == RESULT_VALUE and res_total == len(res):
        info = {"ok": True, "value": res[1:].decode("utf-8", errors="replace")}
    elif res and res_total <= value_limit + 4096:
        try:
            info = json.loads(res.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            pass
        info = info if isinstance(info, dict) else None
    if info is not None:
        result["memory_exceeded"] = bool(info.get("memory_exceeded"))
        # A program's ``error`` is kept for failures of the sandbox itself; a function call's is its outcome.
        if info.get("error") and req["kind"] == "call":
            result["error"] = str(info["error"])[:4000]
        if info.get("traceback"):
            result["traceback"] = str(info["traceback"])[-4000:]
    if req["kind"] == "call":
        value = info.get("value") if info else None
        ok = bool(info and info.get("ok")) and exit_code == 0 and isinstance(value, str)
        if ok and len(value) > value_limit:
            ok, result["error"] = False, "return value larger than %d bytes" % value_limit
        result["ok"] = ok
        if ok:
            result["value"] = value
        elif how == TIMED_OUT:
            result["error"] = "timed out after %.3g s" % timeout
        elif how == KILLED:
            result["error"] = "output limit exceeded; the call was killed"
        elif res_total > value_limit:
            result["error"] = "return value larger than %d bytes" % value_limit
        elif "error" not in result:
            result["error"] = "the process ended (exit status %s) before returning" % exit_code
    return result
