"""The sandbox's warm fork server (standard library only; run as ``python -P -s -S _server.py``).

Started once per :class:`~unifiedplayers.sandbox.Sandbox` with an empty environment, it imports the
modules that model-written code usually needs and starts two *cells* per core. Each cell is a *forker*
process that takes, once, every isolation layer that does not change from call to call, and then forks
one short process per call, so a call pays for a fork and a few system calls only:

- the whole server: an empty network namespace (unshared once at start-up, as root);
- each forker: its own unprivileged uid (as root), RLIMIT_NPROC on that uid against fork bombs,
  a clean environment, ``sys.path`` limited to a mirror of the standard library, and a Landlock
  domain: read-only access to that mirror and the system's shared libraries, full access to the cell's
  own directory only, no ``execve``, no TCP, no signals or abstract sockets outside the domain;
- each call: a fresh empty working directory (removed afterwards), its own session, a nested Landlock
  domain (so it cannot signal its forker), and RLIMIT_AS/DATA (memory), CPU, FSIZE and NOFILE.

The forker enforces the call's CPU-time limit (and a wall-clock cap) and afterwards kills every process of its uid but itself
(``kill(-1)``) and, as their subreaper, reaps them all before the next call, so nothing a call started
outlives it or holds the uid's process bound. The server does the rest of the bookkeeping, so
that the forker, whose every written page costs a copy-on-write fault after each fork, writes few: it
dispatches requests to free cells, reads each call's stdout, stderr and result from the cell's pipes,
truncates them and stops floods, builds the results, watches the forkers (a dead or stuck one is killed,
swept and replaced, and its call recorded as failed) and answers the client. Messages with the client
are 4-byte big-endian lengths + UTF-8 JSON.
"""
import builtins
import collections
import ctypes
import datetime
import fcntl
import gc
import io
import json
import os
import random
import re
import resource
import select
import signal
import struct
import sys
import time
import traceback

# Modules model-written code commonly imports, loaded once here so each fork gets them for free. The
# list is short on purpose: every call's fork and exit cost grows with this process's memory
# (benchmarks/README.md, "Where the sandbox's time goes"), so rarer, larger modules (dataclasses,
# statistics) are imported by the calls that use them (datetime is imported by the server itself, for the
# calls' virtual calendar clock). The server itself avoids shutil and sysconfig for the same reason.
PRELOAD = (
    "bisect", "cmath", "collections", "copy", "decimal", "enum", "fractions", "functools", "heapq",
    "itertools", "json", "math", "numbers", "operator", "random", "re", "string", "typing",
)


def _import_random():
    """Import ``random`` with its after-fork hook (a fresh seed in each call, as a fresh interpreter gets)
    calling the C seed directly: ``Random.seed`` would first run its Python checks and ``super()``,
    about 30 copy-on-write faults in every call. Same effect: a seed from the OS, ``gauss_next`` None
    (as this process, which never samples, has it)."""
    import functools

    hooks = []
    register = os.register_at_fork
    os.register_at_fork = lambda **kw: hooks.append(kw)
    try:
        import random
        import _random
    finally:
        os.register_at_fork = register
    for kw in hooks:
        if kw == {"after_in_child": random._inst.seed} and random._inst.gauss_next is None:
            kw = {"after_in_child": functools.partial(_random.Random.seed, random._inst)}
        register(**kw)


_import_random()
for _name in PRELOAD:
    __import__(_name)

# The JSON a call decodes (its argument) and encodes (its return value), through the C scanner and
# encoder built here once: json.loads/json.dumps would first run several layers of Python code, and in a
# fresh fork every object they touch costs a copy-on-write fault. Same text in, same values out.
_JSON_SCAN = json.JSONDecoder().scan_once
_JSON_DEFAULT = json.JSONEncoder().default  # raises TypeError("Object of type X is not JSON serializable")
_c_make_encoder = json.encoder.c_make_encoder
_encode_ascii = json.encoder.encode_basestring_ascii


def _json_loads(text):
    """``json.loads(text)`` of a well-formed document (the client's ``json.dumps`` of the argument)."""
    try:
        value, end = _JSON_SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # raises json's own error
    return value if end == len(text) else json.loads(text)


def _json_dumps(value):
    """``json.dumps(value)`` with its default settings (ensure_ascii, allow_nan, circular check)."""
    if _c_make_encoder is None:
        return json.dumps(value)
    return "".join(_c_make_encoder({}, _JSON_DEFAULT, _encode_ascii, None, ": ", ", ", False, False, True)(value, 0))


STDLIB = os.path.dirname(os.__file__)  # what sysconfig.get_paths()["stdlib"] gives, without sysconfig
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

# Landlock (linux/landlock.h). The syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

SYSTEM_READ_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo")
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
STDLIB_SKIP = {
    "site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo",
    "ensurepip", "lib2to3", "venv", "pydoc_data", "config-3.11-x86_64-linux-gnu",
}


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock_abi():
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return int(abi) if abi > 0 else 0


def _fs_rights(abi):
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


class Landlock:
    """Builds and applies one Landlock domain per call from path fds opened once at start-up."""

    def __init__(self, read_dirs, read_files):
        self.abi = _landlock_abi()
        self.ok = self.abi > 0
        if not self.ok:
            return
        self.handled_fs = _fs_rights(self.abi)
        self.handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if self.abi >= 4 else 0
        self.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if self.abi >= 6 else 0
        read = FS_READ_FILE | FS_READ_DIR
        self.rules = []  # (O_PATH fd, rights)
        for path in read_dirs:
            if os.path.isdir(path):
                self.rules.append((os.open(path, os.O_PATH | os.O_CLOEXEC), read))
        for path in read_files:
            if os.path.exists(path):
                rights = FS_READ_FILE | (FS_WRITE_FILE if path == "/dev/null" else 0)
                self.rules.append((os.open(path, os.O_PATH | os.O_CLOEXEC), rights & self.handled_fs))

    def _add(self, ruleset, fd, rights):
        attr = _PathBeneathAttr(rights & self.handled_fs, fd)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                         ctypes.byref(attr), 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_add_rule")

    def ruleset(self, cell_dir):
        """A ruleset: the read-only paths plus everything but execute beneath ``cell_dir``."""
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = ctypes.sizeof(_RulesetAttr) if self.abi >= 6 else 16
        ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        for fd, rights in self.rules:
            self._add(ruleset, fd, rights)
        wd = os.open(cell_dir, os.O_PATH | os.O_CLOEXEC)
        self._add(ruleset, wd, self.handled_fs & ~FS_EXECUTE)
        os.close(wd)
        return int(ruleset)

    @staticmethod
    def restrict(ruleset, no_new_privs=True):
        """Confine the calling process and its future children. ``no_new_privs=False`` where the flag is
        already set (it is inherited: a call's fork of a confined cell worker has it)."""
        if no_new_privs and _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")


def stdlib_mirror(cache_root, src=STDLIB):
    """A world-readable mirror of the standard library (hard links where possible).

    A call that runs under an unprivileged uid cannot read an interpreter installed under a private
    home (pyenv under /root, mode 700). The mirror leaves out site-packages, so third-party packages
    stay out of reach even by path.
    """
    dynload = os.path.join(src, "lib-dynload")
    # A stable name (str hashes are salted per process): one mirror per interpreter, reused.
    tag = "stdlib-%s-%08x" % (sys.version.split()[0], _fnv32("%s|%s" % (src, sys.version)))
    dst = os.path.join(cache_root, tag)
    if os.path.isdir(dst):
        return dst
    tmp = dst + ".tmp%d" % os.getpid()

    def link(s, d):
        # A symbolic link is mirrored as the file it names: a distribution's stdlib has relative ones (Debian's
        # _sysconfigdata__linux_*.py -> its sibling, which may not be mirrored yet) and ones that leave the
        # tree (sitecustomize.py -> /etc/...), and a hard link to the link itself would dangle in the mirror.
        # One that names nothing is left out, as the interpreter itself could not import it.
        real = os.path.realpath(s)
        if not os.path.isfile(real):
            return
        if os.stat(real).st_mode & 0o444 == 0o444:  # already world-readable: share the inode
            try:
                os.link(real, d)
                return
            except OSError:  # another file system: copy
                pass
        # a copy (never a chmod through a hard link, which would change the installed file's mode)
        with open(real, "rb") as fi, open(d, "wb") as fo:
            fo.write(fi.read())
        os.chmod(d, 0o644)

    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in STDLIB_SKIP]
        else:
            dirs[:] = [d for d in dirs if d not in ("test", "tests", "idle_test")]
        os.makedirs(os.path.join(tmp, rel), mode=0o755, exist_ok=True)
        for f in files:
            if f.endswith((".py", ".pyc", ".so")) or os.path.dirname(os.path.join(root, f)) == dynload:
                link(os.path.join(root, f), os.path.join(tmp, rel, f))
    for root, dirs, _files in os.walk(tmp):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, dst)
    except OSError:  # another server built it first
        _rmtree(tmp)
    return dst


def _private_tmpfs(path, size_mb):
    """Mount a size-capped tmpfs on ``path``, seen by this process and its children only (a private
    mount namespace: it disappears with them, even if they are killed). Returns an error text or None.

    The calls' working directories live there: creating and removing a directory costs ~1 ms on this
    machine's disk and ~13 us in memory, and the cap bounds what the calls can write all together."""
    _libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    if _libc.unshare(CLONE_NEWNS) != 0:
        return "unshare(CLONE_NEWNS): " + os.strerror(ctypes.get_errno())
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "mount --make-rprivate /: " + os.strerror(ctypes.get_errno())
    options = ("size=%dm,mode=0711" % size_mb).encode()
    if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options) != 0:
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


def _enter_user_namespace(flags=0):
    """``unshare(CLONE_NEWUSER | flags)``, then map this process's ids to themselves. Returns an error text or None.
    A failure after the unshare leaves the process in a namespace without a map: only a throw-away process (the
    trial, :func:`_user_namespace_trial`) or one that then exits may call this where it can fail."""
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER | flags) != 0:
        err = ctypes.get_errno()
        hint = {28: " (user.max_user_namespaces is 0 or reached)",
                1: " (unprivileged user namespaces are forbidden here: kernel.unprivileged_userns_clone or an "
                   "AppArmor/SELinux policy)"}.get(err, "")
        return "unshare(CLONE_NEWUSER) failed: %s%s" % (os.strerror(err), hint)
    return _write_id_maps(uid, gid)


def _drop_capabilities():
    """Clear every capability of this process (effective, permitted and inheritable sets; the ambient set goes with
    the permitted one). A process that makes a user namespace holds every capability inside it; the calls hold none."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
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
            if _enter_user_namespace() is None:
                _set_rlimit(resource.RLIMIT_NPROC, 3)
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


def _user_namespace_trial(cfg, root):
    """Try, in a throw-away child, every step the server takes in a user namespace (the namespace and its id map,
    an empty network namespace, the private tmpfs) and whether RLIMIT_NPROC counts per namespace; the server takes
    the steps itself only when all of them worked here, so that it never stops half way. Returns ``(why the user
    namespace cannot serve or None, why the process bound is missing or None)``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            why = _enter_user_namespace()
            if why is None and not cfg["network"] and _libc.unshare(CLONE_NEWNET) != 0:
                why = "unshare(CLONE_NEWNET) in the user namespace failed: %s" % os.strerror(ctypes.get_errno())
            if why is None and int(cfg.get("workdir_tmpfs_mb") or 0) > 0:
                why = _private_tmpfs(root, int(cfg["workdir_tmpfs_mb"]))
            answer = {"why": why, "nproc": _nproc_counts_per_namespace() if why is None else None}
        except BaseException as exc:  # noqa: BLE001 - any failure is a reason to fall back
            answer = {"why": "%s: %s" % (type(exc).__name__, exc), "nproc": None}
        finally:
            _write_all(w, json.dumps(answer).encode())
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


def _enter_cell_namespaces(st):
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
        why = _enter_user_namespace(CLONE_NEWPID)
        if why is not None:
            raise OSError(why)
        forker = os.fork()
    except BaseException:  # noqa: BLE001
        text = ("cell namespaces: " + traceback.format_exc()[-1800:]).encode()
        _write_all(st, FATAL + struct.pack(">I", len(text)) + text)
        os._exit(70)
    if forker == 0:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(forker, signal.SIGKILL))
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the server gone: this process, then the forker, go
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


def _frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue


def _send(obj):
    _write_all(1, _frame(obj))


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        try:
            part = os.read(fd, n - len(buf))
        except InterruptedError:
            continue
        if not part:
            return None
        buf += part
    return buf


def _read_frame(fd):
    hdr = _read_exact(fd, 4)
    if hdr is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", hdr)[0])
    return None if body is None else json.loads(body)


class FrameReader:
    """Incremental framing over a non-blocking descriptor."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, chunk):
        self.buf += chunk
        out = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", self.buf[:4])
            if len(self.buf) < 4 + n:
                break
            out.append(json.loads(bytes(self.buf[4: 4 + n])))
            del self.buf[: 4 + n]
        return out


def _set_rlimit(kind, value):
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _rmtree(path):
    """Remove a directory tree that a call left behind, iteratively and by descriptor (no recursion
    limit, no path-length limit). Directories the call made unreadable are opened up first (the remover
    owns them); symbolic links are removed, never followed. What cannot be removed is left for the
    server's final clean-up, never raised."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.chmod(path, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    try:
        top = os.open(path, flags)
    except OSError:
        try:
            os.unlink(path)  # a file or a link
        except OSError:
            pass
        return
    stack = [(top, None, None)]  # (directory fd, parent fd, name in parent)
    given_up = set()  # (dev, inode) of directories that could not be emptied: never revisited
    while stack:
        fd, parent, name = stack[-1]
        child = None
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            os.unlink(entry.name, dir_fd=fd)
                            continue
                        if (entry.inode(), fd) in given_up:
                            continue
                        try:
                            os.chmod(entry.name, 0o700, dir_fd=fd)
                        except OSError:
                            pass
                        child = (os.open(entry.name, flags, dir_fd=fd), fd, entry.name)
                        break
                    except OSError:
                        given_up.add((entry.inode(), fd))
        except OSError:
            pass
        if child is not None:
            stack.append(child)
            continue
        stack.pop()
        if parent is not None:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                given_up.add((os.fstat(fd).st_ino, parent))
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _fnv32(text):
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


# ---------------------------------------------------------------------------------------------------
# One call: the forked process that runs untrusted code.


def _user_traceback(exc):
    """The traceback of the user's code only: the server's own frames (and its path) are left out."""
    te = traceback.TracebackException.from_exception(exc)
    stack = [f for f in te.stack if f.filename != __file__]
    te.stack = traceback.StackSummary.from_list(stack)
    return "".join(te.format())


# ---------------------------------------------------------------------------------------------------
# What a call reads that would change from run to run (sandbox.deterministic): the calendar clock, the random
# generators and the str hash (PYTHONHASHSEED, set by the client). Model-written code that printed
# time.time() gave another observation, and so another trajectory, in every run of one seed.

VIRTUAL_EPOCH = 1767225600.0  # 2026-01-01 00:00:00 UTC: the calendar time at which every call starts
VIRTUAL_TICK = 1e-6  # seconds the virtual calendar clock advances at each reading
_virtual = [0.0]  # seconds since the call began, on its virtual clock (0 in the forker: each call starts there)
_real = {name: getattr(time, name) for name in ("sleep", "localtime", "gmtime", "strftime", "asctime",
                                                "clock_gettime", "clock_gettime_ns")}
_RealDatetime = datetime.datetime


def _virtual_sleep(seconds):
    _real["sleep"](seconds)  # it still waits: the wall-clock cap of a call sees a sleeper
    _virtual[0] += max(0.0, float(seconds))


class _VirtualDatetime(_RealDatetime):
    """``datetime.datetime`` whose ``now``, ``utcnow`` and ``today`` read the virtual clock."""

    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(time.time(), tz)

    @classmethod
    def utcnow(cls):
        return cls.fromtimestamp(time.time(), datetime.timezone.utc).replace(tzinfo=None)

    @classmethod
    def today(cls):
        return cls.now()


_VirtualDatetime.__name__ = "datetime.datetime"  # the type name its repr prints, as the C type's
_VirtualDatetime.__qualname__, _VirtualDatetime.__module__ = "datetime", "datetime"
_VirtualDatetime.min, _VirtualDatetime.max = _VirtualDatetime(1, 1, 1), _VirtualDatetime(9999, 12, 31, 23, 59, 59, 999999)


def _deterministic_call(on, seed=0):
    """Runs in each call before its code, so that a call gives the same output in every run, whatever the date:

    - the calendar clock (``time.time``, ``time_ns``, ``localtime``, ``gmtime``, ``ctime``, ``strftime``,
      ``clock_gettime(CLOCK_REALTIME)``, ``datetime.now``, ``date.today``) is virtual: it starts at VIRTUAL_EPOCH
      + ``seed`` seconds and advances VIRTUAL_TICK per reading and by what the call sleeps. The interval clocks
      (``monotonic``, ``perf_counter``, ``process_time``) stay real: the standard library's deadlines
      (``queue``, ``threading``, ``asyncio``, ``subprocess``) run on them;
    - ``random`` starts from ``seed``, an unseeded ``random.Random()`` (``tempfile``'s names) and ``os.urandom``
      / ``os.getrandom`` (``uuid4``, ``secrets``) draw from a stream seeded by it.

    Not changed: ``/dev/urandom`` read as a file, object addresses (``id``, a default ``repr``) and the pid.
    ``on``: sandbox.deterministic. Each replacement is a staticmethod, so that one stored as a class attribute
    (``logging.Formatter.converter = time.localtime``) does not bind, as the built-ins it replaces do not."""
    if not on:
        return
    epoch, stream = VIRTUAL_EPOCH + seed, random.Random(0x5EED + seed)

    def now():
        _virtual[0] += VIRTUAL_TICK
        return epoch + _virtual[0]

    def at(secs):
        return now() if secs is None else secs

    def clock(clk_id):
        return now() if clk_id == time.CLOCK_REALTIME else _real["clock_gettime"](clk_id)

    def clock_ns(clk_id):
        return int(round(now() * 1e9)) if clk_id == time.CLOCK_REALTIME else _real["clock_gettime_ns"](clk_id)

    def reseed(self, a=None, version=2):
        _seed(self, stream.getrandbits(64) if a is None else a, version)

    patched = {
        "time": now, "time_ns": lambda: int(round(now() * 1e9)), "sleep": _virtual_sleep,
        "localtime": lambda secs=None: _real["localtime"](at(secs)),
        "gmtime": lambda secs=None: _real["gmtime"](at(secs)),
        "ctime": lambda secs=None: _real["asctime"](_real["localtime"](at(secs))),
        "asctime": lambda t=None: _real["asctime"](_real["localtime"](now()) if t is None else t),
        "strftime": lambda fmt, t=None: _real["strftime"](fmt, _real["localtime"](now()) if t is None else t),
        "clock_gettime": clock, "clock_gettime_ns": clock_ns,
    }
    for name, fn in patched.items():
        setattr(time, name, staticmethod(fn))
    datetime.datetime = _VirtualDatetime
    _seed = random.Random.seed
    random.Random.seed = reseed
    random.seed(seed)
    os.urandom = random._urandom = staticmethod(lambda n: stream.randbytes(n))
    os.getrandom = staticmethod(lambda size, flags=0: stream.randbytes(size))


def _call_process(kind, text, code, function, payload, timeout, cfg, workdir, out_w, err_w, res_w, null_fd,
                  ruleset, seed=0):
    """Runs in the fork of a cell's forker. Never returns. ``text``: the program (kind "run") or the source
    (kind "call"); ``code``: that source compiled by the forker (None: compile it here); ``payload``: the
    function's argument as JSON bytes. The memory, file-size and descriptor limits are the forker's own,
    inherited; the CPU limit is per call."""
    try:
        os.setsid()  # its own session and process group
        if not cfg["_contained"]:
            # Under a uid or in a PID namespace of its own the call dies with its forker, by the forker's sweep
            # (see _take_cell_uid) or with the namespace; without either, by this signal. (Each ctypes call costs a fork ~0.1 ms of
            # copy-on-write faults here, so the calls make as few as they can.)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(null_fd, 0)
        os.dup2(res_w, 3)
        os.chdir(workdir)  # HOME and TMPDIR already name it (see Forker.work)
        if ruleset is not None:
            Landlock.restrict(ruleset, no_new_privs=False)  # a nested domain: no signals to the forker
        os.closerange(4, 1 << 16)
        _set_rlimit(resource.RLIMIT_CPU, int(timeout) + 2)  # a backstop: the forker's watch ends it first
        _deterministic_call(cfg.get("deterministic", True), seed)
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
            value = fn(_json_loads(payload.decode("utf-8", errors="surrogateescape")))
            try:
                out["value"] = _json_dumps(value)
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
        out["error"] = "MemoryError: the call exceeded its %d MB memory cap" % cfg["memory_mb"]
        print(out["error"], file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - anything the code raises is its failure
        out["exit_code"] = 1
        try:
            tb = _user_traceback(exc)
        except MemoryError:
            tb = repr(exc)
        print(tb, file=sys.stderr, end="")
        out["ok"] = False
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
        out["traceback"] = tb[-4000:]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a broken stream must not lose the result
        pass
    try:
        if out.get("ok") and out["exit_code"] == 0 and not out["memory_exceeded"] and len(out) == 4:
            _write_all(3, RESULT_VALUE + out["value"].encode("utf-8", errors="surrogateescape"))
        else:
            _write_all(3, json.dumps(out).encode())
    except BaseException:  # noqa: BLE001
        pass
    code = out["exit_code"]
    os._exit(code & 0xFF if isinstance(code, int) and code >= 0 else 1)


# ---------------------------------------------------------------------------------------------------
# A cell worker: one call at a time, under its own uid and Landlock domain.


# re functions -> index of their ``flags`` argument
_RE_FLAGS_ARG = {"compile": 1, "match": 2, "search": 2, "fullmatch": 2, "findall": 2, "finditer": 2,
                 "split": 3, "sub": 4, "subn": 4}
PyCF_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST, without importing ast into every call's parent


def _re_flags(node):
    """The value of a flags expression made of ``re.X`` names, ``|`` and integers, else None."""
    kind = type(node).__name__
    if kind == "Constant" and type(node.value) is int:
        return node.value
    if kind == "Attribute" and type(node.value).__name__ == "Name" and node.value.id == "re":
        flag = getattr(re, node.attr, None)
        return int(flag) if isinstance(flag, re.RegexFlag) else None
    if kind == "BinOp" and type(node.op).__name__ == "BitOr":
        left, right = _re_flags(node.left), _re_flags(node.right)
        return None if left is None or right is None else left | right
    return None


def _literal_patterns(source):
    """(pattern, flags) of every ``re.<function>("literal", ...)`` call in ``source``."""
    found, stack = [], [compile(source, "<source>", "exec", PyCF_ONLY_AST)]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "Call":
            func, args = node.func, node.args
            if (type(func).__name__ == "Attribute" and func.attr in _RE_FLAGS_ARG
                    and type(func.value).__name__ == "Name" and func.value.id == "re"
                    and args and type(args[0]).__name__ == "Constant"
                    and type(args[0].value) in (str, bytes)):
                flags, at = 0, _RE_FLAGS_ARG[func.attr]
                if len(args) > at:
                    flags = _re_flags(args[at])
                for kw in node.keywords:
                    if kw.arg == "flags":
                        flags = _re_flags(kw.value)
                if flags is not None:
                    found.append((args[0].value, flags))
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend(v for v in value if hasattr(v, "_fields"))
            elif hasattr(value, "_fields"):
                stack.append(value)
    return found


def _warm_regexes(source):
    """Compile the literal regular expressions of ``source`` into ``re``'s cache in the cell worker,
    so that each call of that source finds them compiled (the same ``re._compile`` the call would run;
    compiled in a fresh fork instead, a pattern is paid for by every call, mostly in copy-on-write faults)."""
    try:
        for pattern, flags in _literal_patterns(source)[:32]:
            try:
                re.compile(pattern, flags)
            except (re.error, TypeError, ValueError, OverflowError, RecursionError):
                pass
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass


CODE_CACHE_ENTRIES = 64  # compiled sources kept per cell
CODE_CACHE_MAX_SOURCE = 1 << 16  # larger sources are compiled by their call

# Messages. Server -> forker: MSG_RUN + RUN_HEADER + text + function NUL payload, or MSG_KILL (end the
# running call now: its output is flooding). Binary rather than JSON: a forker that parses JSON touches
# about three times as many pages per call, each a copy-on-write fault. RUN_HEADER: kind, the
# source's key in the forker's code cache (0: none), a key the forker may drop from its cache (0: none),
# the lengths of text and of function NUL payload, the timeout, the call's seed. ``text`` is the program (run), or the
# source (call) the first time the forker sees that key, else empty. Forker -> server: DONE (after the
# call was reaped and swept), CELL_ERROR (this call could not be run) or FATAL (the cell could not start),
# the last two followed by a 4-byte length and UTF-8 text.
# A call's result pipe: RESULT_VALUE and the return value's JSON when the call returned normally, else a
# JSON object (exit_code, memory_exceeded, ok, value, error, traceback).
MSG_RUN, MSG_KILL = b"R", b"K"
RESULT_VALUE = b"\x01"
RUN_HEADER = struct.Struct(">BIIIIdI")
KIND_RUN, KIND_CALL = 0, 1
DONE, CELL_ERROR, FATAL = b"D", b"E", b"F"
DONE_BODY = struct.Struct(">iBd")  # wait status, how it was ended (0 itself, 1 timeout, 2 killed), seconds
ENDED, TIMED_OUT, KILLED = 0, 1, 2


# ---------------------------------------------------------------------------------------------------
# A cell: one *forker* process under its own uid and Landlock domain, which forks one process per call.
#
# Every fork write-protects all the memory of the process that forks, so each page that process writes
# afterwards costs it a page fault (dear in this VM, several microseconds each). The forker therefore does
# as little as it can per call: read the request, fork, wait (enforcing the wall clock), sweep, report.
# The call's stdout, stderr and result travel through three pipes that live as long as the cell, which the
# server reads, limits and turns into results; the server never forks per call, so that bookkeeping costs
# no faults. One call at a time per cell, so a pipe's bytes always belong to the cell's current call: the
# server sends the next request only after the DONE of the previous one, once it has drained the pipes.


class Forker:
    def __init__(self, cfg, iso, cell_dir, ruleset, fds):
        # Every process a call starts can be found and killed: all of the cell's uid, or all of its PID namespace.
        self.contained = bool(iso["uid"] or iso.get("pidns"))
        self.cfg = dict(cfg, _contained=self.contained)
        self.wall_factor = float(cfg.get("wall_timeout_factor") or 1.0)
        self.iso, self.dir, self.ruleset = iso, cell_dir, ruleset
        self.ctl, self.st, self.out_w, self.err_w, self.res_w = fds
        # Every call of this cell works in the same path, created empty before the call and removed after
        # it, so HOME and TMPDIR are set once here and not in each call (where setting os.environ costs
        # some 35 copy-on-write faults).
        self.work = os.path.join(cell_dir, "w")
        os.environ["HOME"] = os.environ["TMPDIR"] = self.work
        self.stale = 0
        self.null = os.open("/dev/null", os.O_RDWR)
        self.codes = {}  # source -> code object, most recently used last

    def compiled(self, key, drop, text):
        """(code, source) of a call's source, compiled once per forker and reused for every call of that
        source (a verifier is called on every trajectory and variant of its task). The server keeps the
        keys and says which to drop, so both sides agree on what is cached. A source that does not compile
        is left to the call itself (code None), which reports its SyntaxError."""
        if drop:
            self.codes.pop(drop, None)
        if text:
            source = text.decode("utf-8", errors="surrogateescape")
            try:
                code = compile(source, "<source>", "exec")
            except BaseException:  # noqa: BLE001 - the call compiles it again and reports why
                code = None
            else:
                _warm_regexes(source)
            if key:
                self.codes[key] = (code, source)
            return code, source
        return self.codes[key]

    def sweep(self, pgid):
        """Kill every process the call started: all of this uid but this forker, or all of this PID namespace but
        its first process (this forker), or the call's group."""
        try:
            if self.contained:
                os.kill(-1, signal.SIGKILL)
            else:
                os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass

    def reap(self, pgid):
        """After a call: kill what it left running and, under the cell's own uid or in its PID namespace, wait
        until no process but this forker is left: killed and reaped (the forker is their subreaper, or the
        namespace's init, so every orphan of a call is its child). A process counts against RLIMIT_NPROC until it
        is reaped, so a fork bomb's leftovers would otherwise make the next calls' forks fail."""
        self.sweep(pgid)
        while self.contained:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:  # none left: the cell is clean
                return
            time.sleep(0.001)  # some are still dying
            self.sweep(pgid)  # or were forked after the last kill

    def fork_call(self):
        for attempt in range(2):
            try:
                return os.fork()
            except BlockingIOError:  # the process bound is exhausted by a previous call's leftovers
                self.sweep(0)
                time.sleep(0.01)
        return os.fork()

    def next_request(self):
        """The next request as (header fields, text, function, payload), or None when the server has
        closed the pipe. A kill message left over from a call that ended by itself meanwhile is skipped."""
        while True:
            kind = _read_exact(self.ctl, 1)
            if kind is None:
                return None
            if kind == MSG_KILL:
                continue
            header = _read_exact(self.ctl, RUN_HEADER.size)
            if header is None:
                return None
            fields = RUN_HEADER.unpack(header)
            text = _read_exact(self.ctl, fields[3]) if fields[3] else b""
            rest = _read_exact(self.ctl, fields[4])
            if text is None or rest is None:
                return None
            function, _, payload = rest.partition(b"\0")
            return fields, text, function, payload

    def run(self, request):
        (kind, key, drop, _, _, timeout, seed), text, function, payload = request
        workdir = self.work
        try:
            os.mkdir(workdir, 0o700)
        except FileExistsError:  # what a previous call left could not all be removed: set it aside
            self.stale += 1
            os.rename(workdir, "%s.stale-%d-%d" % (workdir, os.getpid(), self.stale))
            os.mkdir(workdir, 0o700)
        if kind == KIND_CALL:
            code, text = self.compiled(key, drop, text)
            function = function.decode("utf-8", errors="surrogateescape")
        else:
            code, text = None, text.decode("utf-8", errors="surrogateescape")
        start = time.monotonic()
        pid = self.fork_call()
        if pid == 0:
            _call_process(kind, text, code, function, payload, timeout, self.cfg, workdir, self.out_w,
                          self.err_w, self.res_w, self.null, self.ruleset, seed)
        pidfd = os.pidfd_open(pid)
        how, server_gone = self.watch(pid, pidfd, start, timeout)
        if how != ENDED:
            os.kill(pid, signal.SIGKILL)  # our own unreaped child: its pid cannot have been reused
            self.sweep(pid)
        _, status, usage = os.wait4(pid, 0)
        duration = time.monotonic() - start
        if how == ENDED and usage.ru_utime + usage.ru_stime >= timeout:
            how = TIMED_OUT  # it spent its CPU budget before the watch saw it (RLIMIT_CPU's SIGXCPU, say)
        os.close(pidfd)
        self.reap(pid)  # whatever it left running (daemons, setsid'd children) dies now
        try:
            os.rmdir(workdir)  # most calls write nothing: one system call
        except OSError:
            _rmtree(workdir)
        if server_gone:
            os._exit(0)
        _write_all(self.st, DONE + DONE_BODY.pack(status, how, duration))

    def watch(self, pid, pidfd, start, timeout):
        """Wait for call ``pid`` to end: ``(how, server_gone)``. It times out once it has used ``timeout`` seconds
        of CPU time, or ``wall_timeout_factor`` times that of wall clock (a call that sleeps or blocks).

        CPU time, not wall clock, decides: a call that finishes within its budget on a quiet machine finishes
        within it under any load, so a verdict or an observation never depends on what else the machine runs.
        The process's CPU clock (clock_getcpuclockid) is read only when the budget could be spent: a call can
        spend no more CPU than the wall clock that has passed (per thread), so the watch sleeps until then."""
        clock = ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED): all its threads, in ns
        wall_deadline = start + timeout * self.wall_factor
        while True:
            try:
                used = time.clock_gettime(clock)
            except OSError:  # it has ended (wait4's rusage has the last word)
                used = 0.0
            wait = min(wall_deadline - time.monotonic(), timeout - used)
            if wait <= 0:
                return TIMED_OUT, False
            try:
                ready, _, _ = select.select([pidfd, self.ctl], [], [], max(min(wait, 1.0), 0.005))
            except InterruptedError:
                continue
            if pidfd in ready:
                return ENDED, False
            if ready:  # while a call runs the server only ever sends a kill
                return KILLED, os.read(self.ctl, 1) == b""

    def serve(self):
        while True:
            request = self.next_request()
            if request is None:
                os._exit(0)
            try:
                self.run(request)
            except BaseException:  # noqa: BLE001 - report, and keep serving
                text = ("sandbox cell failed: " + traceback.format_exc()[-1500:]).encode()
                _write_all(self.st, CELL_ERROR + struct.pack(">I", len(text)) + text)


def _build_result(req, limit, value_limit, out, err, res, out_total, err_total, res_total, status, how,
                  duration, timeout):
    """The client's view of one finished call, from what the server read of its three pipes."""
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
    exit_code = -signal.SIGKILL if how != ENDED else os.waitstatus_to_exitcode(status)
    result["exit_code"] = exit_code
    if exit_code == 70 and "sandbox setup failed" in result["stderr"]:
        result["error"] = result["stderr"][-1000:]
    info = None
    if res[:1] == RESULT_VALUE and res_total == len(res):
        info = {"ok": True, "value": res[1:].decode("utf-8", errors="replace")}
    elif res and res_total <= value_limit + 4096:
        try:
            info = json.loads(res.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            info = None
        if not isinstance(info, dict):
            info = None
    if info is not None:
        result["memory_exceeded"] = bool(info.get("memory_exceeded"))
        # For a program, what its code raised is in its stderr and exit status; ``error`` is kept for
        # failures of the sandbox itself. For a function call it is the call's outcome.
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


def _keep_only(fds, ruleset):
    """Close every inherited descriptor but the cell's pipes and its Landlock ruleset; those of 0-2 that
    are not kept point at /dev/null."""
    keep = sorted(set(fds) | ({ruleset} if ruleset is not None else set()))
    lo = 0
    for fd in keep:
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 1 << 16)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        if fd not in keep:
            os.dup2(null, fd)


def _take_cell_uid(cfg, iso, cell):
    """The forker's process layer. With uid isolation (root), become the cell's own uid (RLIMIT_NPROC on it) and
    kill whatever that uid left running; then arrange to hear of the server's death: with a uid, SIGTERM, on which
    the forker kills every process of its uid, its calls included, and exits; in the cell's PID namespace (a user
    namespace, not root), RLIMIT_NPROC on the namespace and no capabilities; otherwise SIGKILL."""
    if iso["uid"]:
        uid = iso["uid_base"] + cell
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        # The forker counts too; a call may run max_processes processes at once.
        _set_rlimit(resource.RLIMIT_NPROC, int(cfg["max_processes"]) + 1)
        _await_uid_empty(uid, os.getpid())  # leftovers of an earlier server or forker of this cell
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # a call's orphans become this forker's children
        # When the server dies this forker is told (after setuid, which clears the setting) and
        # kills every process of its uid, its calls included, before it exits.
        forker_pid = os.getpid()

        def on_server_death(signum, frame):
            if os.getpid() != forker_pid:  # inherited by a call: behave as the default action
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)

        signal.signal(signal.SIGTERM, on_server_death)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    elif iso.get("cell_namespaces"):
        # The forker is the first process (init) of the cell's PID namespace (_enter_cell_namespaces): a call's
        # orphans become its children, kill(-1) reaches every process of the namespace but itself, and the
        # namespace, with all it holds, ends when it does. RLIMIT_NPROC counts the cell's user namespace: its
        # first process, this forker and a call's max_processes.
        if iso["pidns"]:
            _set_rlimit(resource.RLIMIT_NPROC, int(cfg["max_processes"]) + 2)
        _drop_capabilities()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the cell's first process gone: all of it goes
    else:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _calls_interpreter(iso):
    """The interpreter state every call inherits: ``sys.path`` limited to the standard library mirror,
    SIGXFSZ and SIGPIPE ignored, and text streams on fds 0-2 (which each call points at the cell's pipes)."""
    sys.path[:] = iso["sys_path"]
    sys.path_importer_cache.clear()
    # The packages loaded before (encodings, json, re, collections, ctypes) look for their submodules in
    # their ``__path__``: the standard library's own directory, which a cell's uid cannot read. Point it
    # at the mirror, or ``import encodings.idna`` fails, and with it every codec not loaded yet (a
    # hostname lookup raised "LookupError: unknown encoding: idna" instead of a network error).
    old, new = os.path.join(STDLIB, ""), os.path.join(iso["sys_path"][0], "")
    for module in list(sys.modules.values()) if old != new else ():
        path = getattr(module, "__path__", None)
        if type(path) is list:  # the same list as the module's spec.submodule_search_locations
            path[:] = [new + p[len(old):] if p.startswith(old) else p for p in path]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sys.argv = ["<sandbox>"]
    # Streams for the calls, bound to fds 0-2, which each call points at the cell's pipes.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)


def _calls_rlimits(cfg):
    """The calls' memory, file-size and descriptor limits, taken once by the forker and inherited by each
    call (the forker itself needs far less)."""
    mem = int(cfg["memory_mb"]) << 20
    _set_rlimit(resource.RLIMIT_AS, mem)
    _set_rlimit(resource.RLIMIT_DATA, mem)
    _set_rlimit(resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) << 20)
    _set_rlimit(resource.RLIMIT_NOFILE, 256)


def _cell_main(cfg, iso, cell, cell_dir, ruleset, fds):
    """Take the per-cell isolation layers, then fork calls. Never returns."""
    st = fds[1]
    try:
        os.setsid()
        _keep_only(fds, ruleset)
        os.chdir(cell_dir)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})  # HOME, TMPDIR: see Forker
        _take_cell_uid(cfg, iso, cell)
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace by the calls (same uid)
        if ruleset is not None:
            Landlock.restrict(ruleset)
        _set_rlimit(resource.RLIMIT_CORE, 0)
        _calls_interpreter(iso)
        forker = Forker(cfg, iso, cell_dir, ruleset, fds)
        _calls_rlimits(cfg)
        # Everything alive now is shared copy-on-write with every call: keep the collector from
        # walking (and so copying) it in each call.
        gc.collect()
        gc.freeze()
    except BaseException:  # noqa: BLE001
        try:
            text = traceback.format_exc()[-2000:].encode()
            _write_all(st, FATAL + struct.pack(">I", len(text)) + text)
        finally:
            os._exit(70)
    forker.serve()
    os._exit(0)


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


def _await_uid_empty(uid, me, timeout=2.0):
    """In a new forker (as ``uid``): kill every other process of ``uid`` and wait until none is left
    (their parent or init reaps them), for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        if not _uid_pids(uid, me) or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _clean_uid(uid, timeout=5.0):
    """In the server, after a cell's forker died: kill every process of ``uid`` and wait until none is
    left. The forker's orphans are the server's children (it is their subreaper): reaped here."""
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


# ---------------------------------------------------------------------------------------------------
# The server: dispatch to cells, watch them, answer the client.


class Cell:
    """The server's side of one cell: the forker's pipes and the call it is running, if any."""

    __slots__ = ("index", "pid", "pidfd", "ctl", "st", "out", "err", "res", "stbuf", "req", "deadline",
                 "bufs", "totals", "kill_sent", "cached")


def _take_isolation(cfg, root, claim_uids):
    """The isolation layers the server process takes once for all its cells: ``(iso, landlock)``. ``iso`` says
    which layers it got (netns, uid or pidns, landlock, tmpfs) and by which ``mechanism`` (``root``; a ``user
    namespace``, not root; ``none``), ``notes`` and ``reasons`` why one is missing (a layer the config switched off
    has no reason), and ``sys_path`` the calls' standard library; ``landlock``: the rules for the cells' rulesets,
    None without Landlock. ``claim_uids(cfg)``: the first uid of a free block."""
    notes = []
    reasons = {}  # layer -> why the machine did not give it (switched off by the config: no entry)
    iso = {"uid": False, "pidns": False, "netns": False, "landlock": False, "cell_namespaces": False}
    if os.geteuid() == 0:
        iso["mechanism"] = "root"
        if cfg["drop_privileges"]:
            iso["uid"] = True
            iso["uid_base"] = claim_uids(cfg)
    else:
        _take_user_namespace(cfg, root, iso, notes, reasons)
    privileged = iso["mechanism"] != "none"
    if not cfg["network"]:
        if _libc.unshare(CLONE_NEWNET) == 0:
            iso["netns"] = True
        else:
            notes.append("network namespace unavailable (%s)" % os.strerror(ctypes.get_errno()))
            reasons["netns"] = "unshare(CLONE_NEWNET) failed: %s" % os.strerror(ctypes.get_errno())
    iso["tmpfs"] = False
    if int(cfg.get("workdir_tmpfs_mb") or 0) > 0 and privileged:
        error = _private_tmpfs(root, int(cfg["workdir_tmpfs_mb"]))
        if error is None:
            iso["tmpfs"] = True
        else:
            notes.append("working directories on disk (%s)" % error)
            reasons["tmpfs"] = notes[-1]
    elif int(cfg.get("workdir_tmpfs_mb") or 0) > 0:
        reasons["tmpfs"] = "not root: cannot mount a private tmpfs; working directories on disk, total uncapped"
    stdlib = STDLIB
    if iso["uid"]:
        stdlib = stdlib_mirror(cfg["mirror_root"])
    iso["sys_path"] = [stdlib, os.path.join(stdlib, "lib-dynload")]
    landlock = None
    if cfg["landlock"]:
        landlock = Landlock([stdlib] + list(SYSTEM_READ_DIRS), DEVICE_FILES)
        iso["landlock"] = landlock.ok
        iso["landlock_abi"] = landlock.abi
        if not landlock.ok:
            notes.append("Landlock unavailable on this kernel")
            # errno of landlock_create_ruleset: ENOSYS not built in, EOPNOTSUPP built in but not enabled
            reasons["landlock"] = "kernel has no Landlock (%s)" % os.strerror(ctypes.get_errno())
            landlock = None
    iso["notes"] = notes
    iso["reasons"] = reasons
    return iso, landlock


def _take_user_namespace(cfg, root, iso, notes, reasons):
    """Not root: enter a user namespace that maps the caller's uid to itself, where the server may make the empty
    network namespace and mount the private tmpfs as root does, and each cell gets a user and PID namespace of its
    own (the ``pidns`` layer, in place of root's per-cell uid). Every step is tried first in a throw-away child
    (:func:`_user_namespace_trial`); where one fails, the server stays where it is (mechanism ``none``, today's
    layers) and says why."""
    if not cfg.get("user_namespace", True):
        iso["mechanism"] = "none"
        reasons["uid"] = ("not root (uid %d): cannot drop to a per-call uid, calls run under the caller's uid "
                          "(sandbox.user_namespace=false)" % os.geteuid())
        notes.append(reasons["uid"])
        return
    why, nproc = _user_namespace_trial(cfg, root)
    if why is not None:
        iso["mechanism"] = "none"
        reasons["uid"] = ("not root (uid %d) and no user namespace (%s): calls run under the caller's uid, their "
                          "descendants not bounded, nor swept once they leave the call's process group"
                          % (os.geteuid(), why))
        notes.append(reasons["uid"])
        iso["user_namespace_error"] = why
        return
    why = _enter_user_namespace()
    if why is not None:  # its trial passed: something changed meanwhile, and this process is now half way
        raise RuntimeError("entering the user namespace failed after its trial had passed: %s" % why)
    iso["mechanism"] = "user namespace"
    iso["cell_namespaces"] = True
    iso["pidns"] = nproc is None
    if nproc is not None:
        reasons["pidns"] = nproc + " (descendants are still swept with their cell's PID namespace)"
        notes.append(reasons["pidns"])


class Server:
    grace = 5.0  # beyond a call's own timeout, before its cell worker is declared stuck

    def __init__(self, cfg):
        self.cfg = cfg
        # Two cells per core: a cell is idle while the server turns its finished call into a result and
        # sends it the next one, and a second cell keeps the core busy meanwhile.
        self.workers = int(cfg["workers"]) or 2 * (os.cpu_count() or 1)
        self.timeout = float(cfg["timeout_s"])
        self.wall_factor = float(cfg.get("wall_timeout_factor") or 1.0)
        self.limit = int(cfg["max_output_bytes"])
        self.value_limit = int(cfg["max_value_bytes"])
        self.flood = max(64 * self.limit, 4 << 20)  # bytes of one stream after which a call is killed
        self.root = cfg["workdir_root"]
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)
        iso, landlock = _take_isolation(cfg, self.root, self.claim_uids)
        iso["workers"] = self.workers
        self.iso = iso
        # One directory per cell, owned by the cell's uid: a call can reach only its own cell.
        self.cell_dirs, self.rulesets = [], []
        for i in range(self.workers):
            d = os.path.join(self.root, "s%d" % i)
            os.mkdir(d, 0o700)
            if iso["uid"]:
                os.chown(d, iso["uid_base"] + i, iso["uid_base"] + i)
            self.cell_dirs.append(d)
            self.rulesets.append(landlock.ruleset(d) if landlock else None)
        self.cells = [self.spawn(i) for i in range(self.workers)]
        self.queue = collections.deque()
        self.inbuf = FrameReader()
        self.source_keys = collections.OrderedDict()  # source text -> key of the forkers' code caches
        self.next_key = 0
        self.stdin_open = True

    def claim_uids(self, cfg):
        """A block of uids that no other live sandbox server on this machine uses.

        Several sandboxes may run at once (tests, an evaluation beside training); each holds an
        exclusive lock on its block for its lifetime, so one server's sweeps never touch another's
        calls. The locks lie in one folder per machine (``uid_lock_root``), not under TMPDIR.
        """
        block = max(64, self.workers)
        for k in range(4096):
            lock_dir = cfg.get("uid_lock_root") or cfg["mirror_root"]  # one folder per machine (client.uid_lock_root)
            fd = os.open(os.path.join(lock_dir, "uids-%d.lock" % k), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid_lock = fd
            return int(cfg["uid_base"]) + k * block
        raise RuntimeError("no free block of sandbox uids")

    def spawn(self, i):
        ctl_r, ctl_w = os.pipe()
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            if self.iso["cell_namespaces"]:
                _enter_cell_namespaces(st_w)  # returns in the forker, PID 1 of the cell's namespace
            _cell_main(self.cfg, self.iso, i, self.cell_dirs[i], self.rulesets[i],
                       (ctl_r, st_w, out_w, err_w, res_w))
        for fd in (ctl_r, st_w, out_w, err_w, res_w):
            os.close(fd)
        s = Cell()
        s.index, s.pid, s.pidfd, s.ctl = i, pid, os.pidfd_open(pid), ctl_w
        s.st, s.out, s.err, s.res = st_r, out_r, err_r, res_r
        for fd in (st_r, out_r, err_r, res_r):
            os.set_blocking(fd, False)
        s.stbuf, s.req, s.deadline, s.kill_sent = bytearray(), None, None, False
        s.cached = collections.OrderedDict()  # keys of the sources this forker has compiled
        s.bufs, s.totals = None, None
        return s

    def replace(self, s, error):
        """A forker died or hung: fail the call it was running, clean up, start a new forker."""
        if self.iso["cell_namespaces"]:
            # The cell's first process (s.pid) kills the forker, the init of the cell's PID namespace, which takes
            # every process in it along, and exits once the forker has: then none is left.
            try:
                os.kill(s.pid, signal.SIGTERM)
                select.select([s.pidfd], [], [], 5.0)
            except OSError:
                pass
        try:
            os.kill(s.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(s.pid, 0)
        except ChildProcessError:
            pass
        if self.iso["uid"]:
            _clean_uid(self.iso["uid_base"] + s.index)
        for fd in (s.pidfd, s.ctl, s.st, s.out, s.err, s.res):
            os.close(fd)
        for name in os.listdir(self.cell_dirs[s.index]):
            _rmtree(os.path.join(self.cell_dirs[s.index], name))
        if s.req is not None:
            _send({"id": s.req["id"], "exit_code": -signal.SIGKILL, "ok": False, "stdout": "", "stderr": "",
                   "timed_out": error.startswith("timed out"), "error": error})
        self.cells[s.index] = self.spawn(s.index)

    def start_call(self, s, req):
        s.req = req
        s.bufs = (bytearray(), bytearray(), bytearray())
        s.totals = [0, 0, 0]
        s.kill_sent = False
        timeout = float(req.get("timeout_s") or self.timeout)
        s.deadline = time.monotonic() + timeout * self.wall_factor + self.grace
        key = drop = 0
        if req["kind"] == "call":
            kind, text = KIND_CALL, req["source"]
            rest = ("%s\0%s" % (req["function"], req["payload"])).encode("utf-8", errors="surrogateescape")
            if len(text) <= CODE_CACHE_MAX_SOURCE:
                key = self.source_keys.pop(text, None)
                if key is None:
                    # Keys only grow, so a forgotten source's key is never reused: a forker still
                    # caching it drops it in its turn (its own least-recently-used order, below).
                    self.next_key += 1
                    key = self.next_key
                    if len(self.source_keys) >= 4096:
                        self.source_keys.popitem(last=False)
                self.source_keys[text] = key
                if key in s.cached:
                    s.cached.move_to_end(key)
                    text = ""
                else:
                    s.cached[key] = None
                    if len(s.cached) > CODE_CACHE_ENTRIES:
                        drop = s.cached.popitem(last=False)[0]
        else:
            kind, text, rest = KIND_RUN, req["code"], b"\0"
        text = text.encode("utf-8", errors="surrogateescape")
        header = RUN_HEADER.pack(kind, key, drop, len(text), len(rest), timeout, int(req.get("seed") or 0) & 0xFFFFFFFF)
        try:
            _write_all(s.ctl, MSG_RUN + header + text + rest)
        except OSError:
            self.replace(s, "sandbox cell worker died")

    def read_output(self, s, k):
        """Read what is waiting in pipe ``k`` (0 stdout, 1 stderr, 2 result) of cell ``s``; False once
        it is empty. Bytes beyond the limits are counted, not kept; a flood is stopped."""
        fd = (s.out, s.err, s.res)[k]
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return False
        if not chunk:
            return False
        if s.req is None:
            return True  # bytes of no call (a leftover of a replaced cell): dropped
        buf = s.bufs[k]
        s.totals[k] += len(chunk)
        if k == 2:
            if len(buf) <= self.value_limit + 4096:
                buf += chunk
            return True
        if len(buf) < self.limit:
            buf += chunk[: self.limit - len(buf)]
        if s.totals[k] > self.flood and not s.kill_sent:
            s.kill_sent = True  # a flood: stop it rather than drain it for the whole timeout
            try:
                _write_all(s.ctl, MSG_KILL)
            except OSError:
                pass
        return True

    def on_status(self, s):
        """Messages from a forker: the end of its call (answered here), or a failure."""
        try:
            chunk = os.read(s.st, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            return  # the forker is gone; its pidfd says so and the cell is replaced
        s.stbuf += chunk
        while s.stbuf:
            kind = bytes(s.stbuf[:1])
            if kind == DONE:
                if len(s.stbuf) < 1 + DONE_BODY.size:
                    return
                status, how, duration = DONE_BODY.unpack(bytes(s.stbuf[1:1 + DONE_BODY.size]))
                del s.stbuf[:1 + DONE_BODY.size]
                self.finish(s, status, how, duration)
                continue
            if len(s.stbuf) < 5:
                return
            (n,) = struct.unpack(">I", bytes(s.stbuf[1:5]))
            if len(s.stbuf) < 5 + n:
                return
            text = bytes(s.stbuf[5:5 + n]).decode("utf-8", errors="replace")
            del s.stbuf[:5 + n]
            if kind == FATAL:
                raise RuntimeError("sandbox cell could not start: " + text)
            if s.req is not None:  # CELL_ERROR: the forker could not run this call
                req, s.req = s.req, None
                _send({"id": req["id"], "exit_code": -signal.SIGKILL, "ok": False, "stdout": "",
                       "stderr": "", "error": text})

    def finish(self, s, status, how, duration):
        req = s.req
        if req is None:
            return
        for k in range(3):  # the call and everything it started are gone: what is left is all of it
            while self.read_output(s, k) and s.totals[k] <= self.flood:
                pass
        if how == ENDED and max(s.totals[0], s.totals[1]) > self.flood:
            how = KILLED  # it flooded but ended before the kill: the same outcome whichever came first
        timeout = float(req.get("timeout_s") or self.timeout)
        out, err, res = s.bufs
        result = _build_result(req, self.limit, self.value_limit, out, err, res, s.totals[0], s.totals[1],
                               s.totals[2], status, how, duration, timeout)
        result["id"] = req["id"]
        s.req = s.bufs = None
        _send(result)

    def serve(self):
        _send({"ready": True, "isolation": self.iso, "pid": os.getpid()})
        os.set_blocking(0, False)
        while self.stdin_open or self.queue or any(s.req is not None for s in self.cells):
            for s in self.cells:
                if s.req is None and self.queue:
                    self.start_call(s, self.queue.popleft())
            busy = [s for s in self.cells if s.req is not None]
            wait = None
            if busy:
                wait = max(0.0, min(s.deadline for s in busy) - time.monotonic())
            rl = [s.st for s in self.cells] + [s.pidfd for s in self.cells]
            for s in busy:
                rl += (s.out, s.err, s.res)
            if self.stdin_open:
                rl.append(0)
            try:
                ready, _, _ = select.select(rl, [], [], wait)
            except InterruptedError:
                continue
            ready = set(ready)
            if 0 in ready:
                self.on_stdin()
            for s in list(self.cells):
                for k, fd in enumerate((s.out, s.err, s.res)):
                    if fd in ready:
                        self.read_output(s, k)
                if s.st in ready:
                    self.on_status(s)
                if s.pidfd in ready:
                    self.replace(s, "sandbox cell worker died")
                elif s.req is not None and time.monotonic() > s.deadline:
                    self.replace(s, "timed out (the cell worker did not answer; replaced)")
        for s in self.cells:
            os.close(s.ctl)
        for s in self.cells:
            try:
                os.waitpid(s.pid, 0)
            except ChildProcessError:
                pass
        _rmtree(self.root)

    def on_stdin(self):
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            # The client is gone: stop everything now rather than finish the queue.
            self.stdin_open = False
            self.queue.clear()
            for s in list(self.cells):
                if s.req is not None:
                    self.replace(s, "client closed the sandbox")
            return
        self.queue.extend(self.inbuf.feed(chunk))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    cfg = _read_frame(0)
    if cfg is None:
        return
    try:
        server = Server(cfg)
    except BaseException:  # noqa: BLE001
        _send({"ready": False, "error": traceback.format_exc()})
        return
    if cfg.get("require_isolation"):
        process = "pidns" if server.iso["mechanism"] == "user namespace" else "uid"
        missing = [k for k in ("netns", process, "landlock") if not server.iso.get(k)]
        if missing:
            _send({"ready": False, "error": "isolation layers unavailable: %s (%s)"
                   % (", ".join(missing), "; ".join(server.iso["notes"]))})
            return
    if server.iso["uid"]:  # a dead forker's orphans come to the server, which reaps them (_clean_uid)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    gc.collect()
    gc.freeze()  # what start-up built lasts as long as the server: the collector need not walk it again
    server.serve()


if __name__ == "__main__":
    main()
