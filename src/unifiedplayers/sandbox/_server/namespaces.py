"""Namespaces: the private tmpfs, the user namespace a server that is not root enters (tried first in a throw-away
child, :func:`user_namespace_trial`), and the user and PID namespace of each cell (:func:`enter_cell_namespaces`)."""
import ctypes
import json
import os
import resource
import signal
import struct
import traceback

from .framing import FATAL, write_all
from .kernel import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_REC, PR_SET_PDEATHSIG, _LINUX_CAPABILITY_VERSION_3, libc, set_rlimit

def private_tmpfs(path, size_mb):
    """Mount a size-capped tmpfs on ``path`` in a private mount namespace (it goes with this process and its
    children); the cap bounds what the calls write together. Returns an error text or None."""
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    if libc.unshare(CLONE_NEWNS) != 0:
        return "unshare(CLONE_NEWNS): " + os.strerror(ctypes.get_errno())
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "mount --make-rprivate /: " + os.strerror(ctypes.get_errno())
    options = ("size=%dm,mode=0711" % size_mb).encode()
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options) != 0:
        return "mount tmpfs: " + os.strerror(ctypes.get_errno())
    return None


def _write_id_maps(uid, gid):
    """Map ``uid`` and ``gid`` to themselves in the user namespace just entered, after denying setgroups (as the
    kernel requires of an unprivileged writer). Returns an error text or None."""
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        try:
            fd = os.open("/proc/self/" + name, os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            return "writing /proc/self/%s: %s" % (name, exc.strerror)
    return None


def enter_user_namespace(flags=0):
    """``unshare(CLONE_NEWUSER | flags)``, then map this process's ids to themselves. Returns an error text or None;
    a failure after the unshare leaves no map, so only a process that then exits may call it where it can fail."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | flags) != 0:
        err = ctypes.get_errno()
        hint = {28: " (user.max_user_namespaces is 0 or reached)",
                1: " (unprivileged user namespaces are forbidden here: kernel.unprivileged_userns_clone or an "
                   "AppArmor/SELinux policy)"}.get(err, "")
        return "unshare(CLONE_NEWUSER) failed: %s%s" % (os.strerror(err), hint)
    return _write_id_maps(uid, gid)


def drop_capabilities():
    """Clear every capability of this process (the maker of a user namespace holds them all inside it)."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _nproc_counts_per_namespace():
    """None if RLIMIT_NPROC counts per user namespace (Linux 5.14+), else why the process bound is missing: a child
    in a new user namespace, limited to 3, must fork two waiting children and fail the third (a per-uid count would
    already exceed 3 with this server and its client)."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            if enter_user_namespace() is None:
                set_rlimit(resource.RLIMIT_NPROC, 3)
                r, w = os.pipe()
                forked = []
                for _ in range(3):
                    try:
                        kid = os.fork()
                    except BlockingIOError:
                        break
                    if kid == 0:
                        os.close(w)
                        os.read(r, 1)  # until the parent closes its end
                        os._exit(0)
                    forked.append(kid)
                os.close(w)
                for kid in forked:
                    os.waitpid(kid, 0)
                code = {2: 0, 0: 1, 3: 2}.get(len(forked), 3)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return {0: None,
            1: "this kernel counts RLIMIT_NPROC per uid over the whole machine, not per user namespace (Linux 5.14 "
               "and later): a call's process count is not bounded",
            2: "RLIMIT_NPROC did not bound the processes of a user namespace: a call's process count is not bounded",
            }.get(code, "could not test how RLIMIT_NPROC counts in a user namespace: a call's process count is not "
                        "bounded")


def user_namespace_trial(cfg, root):
    """Try every step the server takes in a user namespace in a throw-away child, so that the server never stops
    half way. Returns ``(why the user namespace cannot serve, why the process bound is missing)``, each or None."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            why = enter_user_namespace()
            if why is None and not cfg.network and libc.unshare(CLONE_NEWNET) != 0:
                why = "unshare(CLONE_NEWNET) in the user namespace failed: %s" % os.strerror(ctypes.get_errno())
            if why is None and cfg.workdir_tmpfs_mb > 0:
                why = private_tmpfs(root, cfg.workdir_tmpfs_mb)
            answer = {"why": why, "nproc": _nproc_counts_per_namespace() if why is None else None}
        except BaseException as exc:  # noqa: BLE001 - any failure is a reason to fall back
            answer = {"why": "%s: %s" % (type(exc).__name__, exc), "nproc": None}
        finally:
            write_all(w, json.dumps(answer).encode())
            os._exit(0)
    os.close(w)
    with open(r, "rb") as f:
        text = f.read()
    os.waitpid(pid, 0)
    try:
        answer = json.loads(text)
    except ValueError:
        return "the user namespace trial died before it answered", None
    return answer["why"], answer["nproc"]


def enter_cell_namespaces(st):
    """In a new cell's first process (user namespace mechanism): make the cell's user and PID namespace, whose init
    becomes the forker (returns there only); this process waits for it, kills it on the server's SIGTERM (each
    signal goes to the sender's own child, whose pid cannot be reused) and exits with it. The namespace, all a call
    started included, ends with its init."""
    server = os.getppid()
    try:
        why = enter_user_namespace(CLONE_NEWPID)
        if why is not None:
            raise OSError(why)
        forker = os.fork()
    except BaseException:  # noqa: BLE001
        text = ("cell namespaces: " + traceback.format_exc()[-1800:]).encode()
        write_all(st, FATAL + struct.pack(">I", len(text)) + text)
        os._exit(70)
    if forker == 0:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(forker, signal.SIGKILL))
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the server gone: this process, then the forker, go
    if os.getppid() != server:
        os._exit(0)
    os.closerange(0, 1 << 16)
    _, status = os.waitpid(forker, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
