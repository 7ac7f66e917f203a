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
    """Mount a size-capped tmpfs on ``path``, seen by this process and its children only (a private
    mount namespace: it disappears with them, even if they are killed). Returns an error text or None.

    The calls' working directories live there: creating and removing a directory costs ~1 ms on this
    machine's disk and ~13 us in memory, and the cap bounds what the calls can write all together."""
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
    """Map ``uid`` and ``gid`` to themselves in the user namespace this process has just entered: one line each,
    after denying setgroups, as the kernel requires of a writer without privileges outside the namespace. The ids
    stay those of the user who started the sandbox (``geteuid()`` is not 0 inside). Returns an error text or None."""
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
    """``unshare(CLONE_NEWUSER | flags)``, then map this process's ids to themselves. Returns an error text or None.
    A failure after the unshare leaves the process in a namespace without a map: only a throw-away process (the
    trial, :func:`user_namespace_trial`) or one that then exits may call this where it can fail."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | flags) != 0:
        err = ctypes.get_errno()
        hint = {28: " (user.max_user_namespaces is 0 or reached)",
                1: " (unprivileged user namespaces are forbidden here: kernel.unprivileged_userns_clone or an "
                   "AppArmor/SELinux policy)"}.get(err, "")
        return "unshare(CLONE_NEWUSER) failed: %s%s" % (os.strerror(err), hint)
    return _write_id_maps(uid, gid)


def drop_capabilities():
    """Clear every capability of this process (effective, permitted and inheritable sets; the ambient set goes with
    the permitted one). A process that makes a user namespace holds every capability inside it; the calls hold none."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _nproc_counts_per_namespace():
    """Whether RLIMIT_NPROC counts the processes of a user namespace (Linux 5.14 and later: per namespace and uid),
    rather than every process of the uid on the machine: a child in a new user namespace, limited to 3 processes,
    forks three children that wait; the first two forks must succeed (a per-uid count would already exceed 3 with
    this server and its client) and the third must fail. Returns None, or why the cells' process bound is missing."""
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
    """Try, in a throw-away child, every step the server takes in a user namespace (the namespace and its id map,
    an empty network namespace, the private tmpfs) and whether RLIMIT_NPROC counts per namespace; the server takes
    the steps itself only when all of them worked here, so that it never stops half way. Returns ``(why the user
    namespace cannot serve or None, why the process bound is missing or None)``."""
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
    text = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        text += chunk
    os.close(r)
    os.waitpid(pid, 0)
    try:
        answer = json.loads(text)
    except ValueError:
        return "the user namespace trial died before it answered", None
    return answer["why"], answer["nproc"]


def enter_cell_namespaces(st):
    """In a new cell's first process, with the user namespace mechanism: a user and a PID namespace of the cell's
    own, whose first process (PID 1 there) goes on to become the forker; this process stays as the forker's parent,
    closes every descriptor, waits for the forker and exits when it has. On SIGTERM (from the server, replacing the
    cell) it kills the forker: the server's signal goes to its own child, whose pid cannot have been reused, and
    the forker's to this process's child. Returns in the forker only.

    Everything a call starts lives in the cell's PID namespace and dies with its first process (the forker): the
    kernel kills the namespace when its init exits, whoever killed it. The cell's user namespace is what
    RLIMIT_NPROC counts (see :func:`_nproc_counts_per_namespace`), and it is what lets a user without privileges
    make the PID namespace."""
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
    while True:
        try:
            _, status = os.waitpid(forker, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
