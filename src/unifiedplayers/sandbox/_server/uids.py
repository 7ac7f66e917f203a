"""The per-cell uids (root): finding, killing and waiting for the processes of a cell's uid."""
import os
import signal
import time

def _uid_pids(uid, exclude=0):
    """Pids of the processes of real uid ``uid`` (zombies included), but ``exclude``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            with open("/proc/%s/status" % name, "rb") as f:
                status = f.read()
            if int(status.split(b"\nUid:", 1)[1].split(None, 1)[0]) == uid:
                pids.append(int(name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            pass
    return pids


def await_uid_empty(uid, me, timeout=2.0):
    """In a new forker (as ``uid``): kill every other process of ``uid``; wait at most ``timeout`` s until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        if not _uid_pids(uid, me) or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def clean_uid(uid, timeout=5.0):
    """In the server, after a cell's forker died: kill every process of ``uid`` and reap them (it is their subreaper)."""
    deadline = time.monotonic() + timeout
    while True:
        _sweep_uid(uid)
        left = _uid_pids(uid)
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)  # ours (an orphan of the dead forker) or not ours
            except ChildProcessError:
                pass
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _sweep_uid(uid):
    """Kill every process of ``uid`` (from a short-lived child that takes that uid)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(0)
    os.waitpid(pid, 0)
