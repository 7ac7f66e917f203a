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


def clean_uid(uid, me=0, timeout=5.0):
    """Kill every process of ``uid`` but ``me`` and wait at most ``timeout`` s until none is left: in a new forker
    ``me``, which runs as ``uid`` (leftovers of an earlier server or forker), or in the server after a cell's forker
    died (it reaps the forker's orphans: it is their subreaper)."""
    deadline = time.monotonic() + timeout
    while True:
        if me:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        else:
            _sweep_uid(uid)
        left = _uid_pids(uid, me)
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)  # an orphan of the dead forker, or not ours
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
