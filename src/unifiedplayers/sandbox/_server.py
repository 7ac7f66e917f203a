"""The sandbox's warm fork server (standard library only; run as ``python -I -S _server.py``).

It is started once per :class:`~unifiedplayers.sandbox.Sandbox` with an empty environment, imports the
modules that model-written code usually needs, and then forks one *runner* per call. Layers of
isolation, each applied in the runner before any untrusted byte runs:

1. its own session and process group, a fresh empty working directory, a minimal environment;
2. (as root) its own unprivileged uid per worker slot, so that RLIMIT_NPROC bounds its processes
   and a final ``kill(-1)`` from that uid removes every process the call started;
3. an empty network namespace (the server unshares it once at start-up, as root);
4. Landlock: read-only access to a mirror of the standard library and the system's shared
   libraries, full access to the working directory only, no ``execve``, no TCP, no signals or
   abstract sockets outside the call;
5. in the *user* process (a grandchild): RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE.

The runner forks the user process, waits for it, removes whatever it left behind and reports its wait
status on a pipe only it holds. The server enforces the wall clock, truncates output and answers the
client. Messages on stdin and stdout are 4-byte big-endian lengths followed by UTF-8 JSON.
"""
import builtins
import collections
import ctypes
import errno
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import sysconfig
import time
import traceback

# Modules model-written code commonly imports, loaded once here so each fork gets them for free.
PRELOAD = (
    "ast", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "enum",
    "fractions", "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "random",
    "re", "statistics", "string", "textwrap", "typing",
)
for _name in PRELOAD:
    __import__(_name)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

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

    def ruleset(self, slot_dir):
        """A ruleset: the read-only paths plus everything but execute beneath ``slot_dir``."""
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = ctypes.sizeof(_RulesetAttr) if self.abi >= 6 else 16
        ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        for fd, rights in self.rules:
            self._add(ruleset, fd, rights)
        wd = os.open(slot_dir, os.O_PATH | os.O_CLOEXEC)
        self._add(ruleset, wd, self.handled_fs & ~FS_EXECUTE)
        os.close(wd)
        return int(ruleset)

    @staticmethod
    def restrict(ruleset):
        """Confine the calling process and its future children (two syscalls, done per call)."""
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")


def stdlib_mirror(cache_root):
    """A world-readable mirror of the standard library (hard links where possible).

    A call that runs under an unprivileged uid cannot read an interpreter installed under a private
    home (pyenv under /root, mode 700). The mirror leaves out site-packages, so third-party packages
    stay out of reach even by path.
    """
    src = sysconfig.get_paths()["stdlib"]
    dynload = os.path.join(src, "lib-dynload")
    tag = "stdlib-%s-%x" % (sys.version.split()[0], abs(hash(src)) & 0xFFFFFFFF)
    dst = os.path.join(cache_root, tag)
    if os.path.isdir(dst):
        return dst
    tmp = dst + ".tmp%d" % os.getpid()

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
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
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _send(obj):
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        view = view[n:]


def _set_rlimit(kind, value):

    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


# ---------------------------------------------------------------------------------------------------
# Inside the call: the runner and the user process.


def _user_process(req, cfg, slot, workdir, pipes, iso):
    """The forked call: every isolation layer, then the untrusted code. Never returns."""
    out_w, err_w, res_w = pipes
    try:
        os.setsid()  # its own session and process group
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        res = os.dup2(res_w, 3, inheritable=False)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        if iso["uid"]:
            uid = cfg["uid_base"] + slot
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            _set_rlimit(resource.RLIMIT_NPROC, int(cfg["max_processes"]))
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        if iso["landlock"]:
            Landlock.restrict(RULESETS[slot])
        os.closerange(4, 1 << 16)  # the server's protocol pipes, other calls' pipes, the rulesets
        sys.path[:] = iso["sys_path"]
        sys.path_importer_cache.clear()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        mem = int(cfg["memory_mb"]) << 20
        _set_rlimit(resource.RLIMIT_AS, mem)
        _set_rlimit(resource.RLIMIT_DATA, mem)
        _set_rlimit(resource.RLIMIT_CPU, int(float(req.get("timeout_s") or cfg["timeout_s"])) + 2)
        _set_rlimit(resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) << 20)
        _set_rlimit(resource.RLIMIT_NOFILE, 256)
        _set_rlimit(resource.RLIMIT_CORE, 0)
    except BaseException:  # noqa: BLE001 - never run untrusted code with a layer missing
        try:
            os.write(2, ("sandbox setup failed: " + traceback.format_exc()[-2000:]).encode())
        finally:
            os._exit(70)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = ["<sandbox>"]
    out = {"exit_code": 0, "memory_exceeded": False}
    try:
        if req["kind"] == "run":
            glb = {"__name__": "__main__", "__builtins__": builtins}
            exec(compile(req["code"], "<sandbox>", "exec"), glb)
        else:
            glb = {"__name__": "__sandbox__", "__builtins__": builtins}
            exec(compile(req["source"], "<source>", "exec"), glb)
            fn = glb.get(req["function"])
            if not callable(fn):
                raise NameError("no function named %r is defined" % req["function"])
            value = fn(json.loads(req["payload"]))
            try:
                out["value"] = json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise TypeError("return value is not JSON-serializable: %s" % exc) from None
            out["ok"] = True
    except SystemExit as exc:
        code = exc.code
        out["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        if req["kind"] == "call":
            out["ok"], out["error"] = False, "SystemExit(%r)" % (code,)
    except MemoryError:
        out.update(exit_code=1, memory_exceeded=True, ok=False)
        out["error"] = "MemoryError: the call exceeded its %d MB memory cap" % cfg["memory_mb"]
        print(out["error"], file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - anything the code raises is its failure
        out["exit_code"] = 1
        try:
            tb = traceback.format_exc()
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
        data = json.dumps(out).encode()
    except BaseException:  # noqa: BLE001
        data = b'{"exit_code": 1, "ok": false, "error": "result could not be encoded"}'
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(res, view):]
    except BaseException:  # noqa: BLE001
        pass
    code = out["exit_code"]
    os._exit(code & 0xFF if isinstance(code, int) and code >= 0 else 1)


RULESETS = {}  # slot -> Landlock ruleset fd


class Sweeper:
    """A process per worker slot, under that slot's uid, that kills every other process of the uid.

    It lives outside the calls' Landlock domain, so (with Landlock's signal scoping) a call cannot
    signal it; if it dies anyway, the server falls back to a one-off sweeper and starts a new one.
    """

    def __init__(self, uid):
        self.uid = uid
        self.start()

    def start(self):
        cmd_r, cmd_w = os.pipe()
        ack_r, ack_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                keep = (cmd_r, ack_w)
                os.closerange(0, min(keep))
                os.closerange(min(keep) + 1, max(keep))
                os.closerange(max(keep) + 1, 1 << 16)
                os.setgroups([])
                os.setgid(self.uid)
                os.setuid(self.uid)
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
                while os.read(cmd_r, 1):
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except OSError:
                        pass
                    os.write(ack_w, b"k")
            except BaseException:  # noqa: BLE001
                pass
            os._exit(0)
        os.close(cmd_r)
        os.close(ack_w)
        self.pid, self.cmd, self.ack = pid, cmd_w, ack_r

    def sweep(self):
        try:
            os.write(self.cmd, b"k")
            if os.read(self.ack, 1) == b"k":
                return
        except OSError:
            pass
        _sweep_uid(self.uid)  # it was killed: sweep the slow way, then replace it
        for fd in (self.cmd, self.ack):
            os.close(fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.start()


LANDLOCK = None


# ---------------------------------------------------------------------------------------------------
# The server loop.


class Call:
    __slots__ = ("req", "slot", "workdir", "pid", "pidfd", "fds", "out", "err", "res", "out_total",
                 "err_total", "start", "deadline", "timed_out", "overflow", "wait_status", "reaped_at")


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


class Server:
    def __init__(self, cfg):
        global LANDLOCK
        self.cfg = cfg
        self.workers = int(cfg["workers"]) or (os.cpu_count() or 1)
        self.timeout = float(cfg["timeout_s"])
        self.limit = int(cfg["max_output_bytes"])
        self.value_limit = int(cfg["max_value_bytes"])
        self.queue = collections.deque()
        self.free = list(range(self.workers))
        self.calls = {}  # fd -> Call
        self.running = []
        self.inbuf = bytearray()
        self.stdin_open = True
        self.seq = 0
        self.root = cfg["workdir_root"]
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)
        notes = []
        iso = {"uid": False, "netns": False, "landlock": False}
        if cfg["drop_privileges"] and os.geteuid() == 0:
            iso["uid"] = True
        elif cfg["drop_privileges"]:
            notes.append("not root: calls run under the caller's uid; descendants that leave the "
                         "call's process group are not bounded or swept")
        # One directory per slot, owned by the slot's uid: a call can reach only its own slot.
        self.slot_dirs = []
        for slot in range(self.workers):
            d = os.path.join(self.root, "s%d" % slot)
            os.mkdir(d, 0o700)
            if iso["uid"]:
                os.chown(d, cfg["uid_base"] + slot, cfg["uid_base"] + slot)
            self.slot_dirs.append(d)
        self.sweepers = {}
        if iso["uid"]:
            for slot in range(self.workers):
                self.sweepers[slot] = Sweeper(cfg["uid_base"] + slot)
                self.sweepers[slot].sweep()  # leftovers of an earlier server
        if not cfg["network"]:
            if _libc.unshare(CLONE_NEWNET) == 0:
                iso["netns"] = True
            else:
                notes.append("network namespace unavailable (%s)" % os.strerror(ctypes.get_errno()))
        stdlib = sysconfig.get_paths()["stdlib"]
        if iso["uid"]:
            stdlib = stdlib_mirror(cfg["mirror_root"])
        iso["sys_path"] = [stdlib, os.path.join(stdlib, "lib-dynload")]
        if cfg["landlock"]:
            LANDLOCK = Landlock([stdlib] + list(SYSTEM_READ_DIRS), DEVICE_FILES)
            iso["landlock"] = LANDLOCK.ok
            iso["landlock_abi"] = LANDLOCK.abi
            if LANDLOCK.ok:
                for slot, d in enumerate(self.slot_dirs):
                    RULESETS[slot] = LANDLOCK.ruleset(d)
            else:
                notes.append("Landlock unavailable on this kernel")
        iso["notes"] = notes
        iso["workers"] = self.workers
        self.iso = iso

    # -- calls ---------------------------------------------------------------------------------
    def start(self, req):
        slot = self.free.pop()
        self.seq += 1
        workdir = os.path.join(self.slot_dirs[slot], "c%d" % self.seq)
        os.mkdir(workdir, 0o700)
        if self.iso["uid"]:
            os.chown(workdir, self.cfg["uid_base"] + slot, self.cfg["uid_base"] + slot)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _user_process(req, self.cfg, slot, workdir, (out_w, err_w, res_w), self.iso)
        for fd in (out_w, err_w, res_w):
            os.close(fd)
        c = Call()
        c.req, c.slot, c.workdir, c.pid = req, slot, workdir, pid
        c.pidfd = os.pidfd_open(pid)
        c.fds = {out_r: "out", err_r: "err", res_r: "res"}
        c.out, c.err, c.res = bytearray(), bytearray(), bytearray()
        c.out_total = c.err_total = 0
        c.start = time.monotonic()
        c.deadline = c.start + float(req.get("timeout_s") or self.timeout)
        c.timed_out = c.overflow = False
        c.wait_status = None
        c.reaped_at = None
        for fd in c.fds:
            os.set_blocking(fd, False)
            self.calls[fd] = c
        self.calls[c.pidfd] = c
        self.running.append(c)

    def sweep(self, c):
        """Remove every process the call started (its whole uid, or its process group)."""
        if self.iso["uid"]:
            self.sweepers[c.slot].sweep()
        else:
            try:
                os.killpg(c.pid, signal.SIGKILL)
            except OSError:
                pass

    def kill(self, c):
        try:
            os.kill(c.pid, signal.SIGKILL)
        except OSError:
            pass
        self.sweep(c)

    def on_read(self, c, fd):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        kind = c.fds[fd]
        if not chunk:
            del c.fds[fd]
            del self.calls[fd]
            os.close(fd)
            return
        if kind == "res":
            if len(c.res) <= self.value_limit + 4096:
                c.res += chunk
            return
        buf = c.out if kind == "out" else c.err
        if len(buf) < self.limit:
            buf += chunk[: self.limit - len(buf)]
        if kind == "out":
            c.out_total += len(chunk)
            total = c.out_total
        else:
            c.err_total += len(chunk)
            total = c.err_total
        if total > max(64 * self.limit, 4 << 20) and not c.overflow:
            c.overflow = True  # a flood: stop it rather than drain it for the whole timeout
            self.kill(c)

    def on_exit(self, c):
        try:
            _, c.wait_status = os.waitpid(c.pid, 0)
        except ChildProcessError:
            c.wait_status = None
        del self.calls[c.pidfd]
        os.close(c.pidfd)
        c.pidfd = None
        c.reaped_at = time.monotonic()
        self.sweep(c)  # whatever it left running (daemons, setsid'd children) dies now

    def finish(self, c):
        for fd, kind in list(c.fds.items()):
            del self.calls[fd]
            os.close(fd)
        c.fds = {}
        self.running.remove(c)
        self.free.append(c.slot)
        shutil.rmtree(c.workdir, ignore_errors=True)
        result = {
            "id": c.req["id"],
            "stdout": c.out.decode("utf-8", errors="replace"),
            "stderr": c.err.decode("utf-8", errors="replace"),
            "stdout_truncated": c.out_total > self.limit,
            "stderr_truncated": c.err_total > self.limit,
            "timed_out": c.timed_out,
            "output_exceeded": c.overflow,
            "duration_s": time.monotonic() - c.start,
            "memory_exceeded": False,
        }
        if c.timed_out or c.overflow or c.wait_status is None:
            exit_code = -signal.SIGKILL
        else:
            exit_code = os.waitstatus_to_exitcode(c.wait_status)
        result["exit_code"] = exit_code
        if exit_code == 70 and "sandbox setup failed" in result["stderr"]:
            result["error"] = result["stderr"][-1000:]
        info = None
        if c.res and len(c.res) <= self.value_limit + 4096:
            try:
                info = json.loads(c.res.decode("utf-8", errors="replace"))
            except (ValueError, RecursionError):
                info = None
            if not isinstance(info, dict):
                info = None
        if info is not None:
            result["memory_exceeded"] = bool(info.get("memory_exceeded"))
            if info.get("error"):
                result["error"] = str(info["error"])[:4000]
            if info.get("traceback"):
                result["traceback"] = str(info["traceback"])[-4000:]
        if c.req["kind"] == "call":
            value = info.get("value") if info else None
            ok = bool(info and info.get("ok")) and exit_code == 0 and isinstance(value, str)
            if ok and len(value) > self.value_limit:
                ok, result["error"] = False, "return value larger than %d bytes" % self.value_limit
            result["ok"] = ok
            if ok:
                result["value"] = value
            elif c.timed_out:
                result["error"] = "timed out after %.3g s" % float(c.req.get("timeout_s") or self.timeout)
            elif c.overflow:
                result["error"] = "output limit exceeded; the call was killed"
            elif len(c.res) > self.value_limit:
                result["error"] = "return value larger than %d bytes" % self.value_limit
            elif "error" not in result:
                result["error"] = "the process ended (exit status %s) before returning" % exit_code
        _send(result)

    # -- loop ----------------------------------------------------------------------------------
    def serve(self):
        _send({"ready": True, "isolation": self.iso, "pid": os.getpid()})
        os.set_blocking(0, False)
        while self.stdin_open or self.queue or self.running:
            while self.queue and self.free:
                self.start(self.queue.popleft())
            now = time.monotonic()
            timeout = None
            for c in self.running:
                t = c.deadline - now if c.reaped_at is None else c.reaped_at + 1.0 - now
                timeout = t if timeout is None else min(timeout, t)
            if timeout is not None:
                timeout = max(0.0, timeout)
            rlist = list(self.calls)
            if self.stdin_open:
                rlist.append(0)
            try:
                ready, _, _ = select.select(rlist, [], [], timeout)
            except InterruptedError:
                continue
            for fd in ready:
                if fd == 0:
                    self.on_stdin()
                    continue
                c = self.calls.get(fd)
                if c is None:
                    continue
                if fd == c.pidfd:
                    self.on_exit(c)
                elif fd in c.fds:
                    self.on_read(c, fd)
            now = time.monotonic()
            for c in list(self.running):
                if c.pidfd is not None and now >= c.deadline and not c.timed_out:
                    c.timed_out = True
                    self.kill(c)
                if c.pidfd is None and (not c.fds or now >= c.reaped_at + 1.0):
                    self.finish(c)
        for c in list(self.running):
            self.kill(c)
        shutil.rmtree(self.root, ignore_errors=True)

    def on_stdin(self):
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            # The client is gone: stop everything now rather than finish the queue.
            self.stdin_open = False
            self.queue.clear()
            for c in list(self.running):
                if c.pidfd is not None:
                    c.timed_out = True
                    self.kill(c)
            return
        self.inbuf += chunk
        while len(self.inbuf) >= 4:
            (n,) = struct.unpack(">I", self.inbuf[:4])
            if len(self.inbuf) < 4 + n:
                break
            req = json.loads(bytes(self.inbuf[4: 4 + n]))
            del self.inbuf[: 4 + n]
            self.queue.append(req)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    hdr = b""
    while len(hdr) < 4:
        part = os.read(0, 4 - len(hdr))
        if not part:
            return
        hdr += part
    (n,) = struct.unpack(">I", hdr)
    body = b""
    while len(body) < n:
        part = os.read(0, n - len(body))
        if not part:
            return
        body += part
    cfg = json.loads(body)
    try:
        server = Server(cfg)
    except BaseException:  # noqa: BLE001
        _send({"ready": False, "error": traceback.format_exc()})
        return
    if cfg.get("require_isolation"):
        missing = [k for k in ("uid", "netns", "landlock") if not server.iso.get(k)]
        if missing:
            _send({"ready": False, "error": "isolation layers unavailable: %s (%s)"
                   % (", ".join(missing), "; ".join(server.iso["notes"]))})
            return
    server.serve()


if __name__ == "__main__":
    main()
