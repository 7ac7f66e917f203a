"""A cell: one *forker* process, which takes the per-cell isolation once (:func:`cell_main`) and then forks one
process per call (:class:`Forker`)."""
import gc
import io
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback

from .call import call_process
from .files import rmtree
from .framing import CELL_ERROR, DONE, DONE_BODY, ENDED, FATAL, KILLED, KIND_CALL, MSG_KILL, RUN_HEADER, TIMED_OUT, read_exact, write_all
from .kernel import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, STDLIB, libc, set_rlimit
from .landlock import Landlock
from .namespaces import drop_capabilities
from .uids import clean_uid
from .warmup import warm_regexes

# Every fork write-protects the forker's memory, so each page it writes afterwards costs a copy-on-write fault: per
# call it only reads the request, forks, waits, sweeps and reports. A call's output travels through the cell's three
# pipes to the server, which sends the next request only once it has drained them after the DONE of this one.


class Forker:
    def __init__(self, cfg, iso, cell_dir, ruleset, fds):
        # Every process a call starts can be found and killed: all of the cell's uid, or all of its PID namespace.
        self.contained = bool(iso["uid"] or iso.get("pidns"))
        self.deterministic, self.memory_mb = cfg.deterministic, cfg.memory_mb
        self.wall_factor = cfg.wall_timeout_factor or 1.0
        self.iso, self.ruleset = iso, ruleset
        self.ctl, self.st, self.out_w, self.err_w, self.res_w = fds
        # Every call works in the same path, made empty before it and removed after it: HOME and TMPDIR set once.
        self.work = os.path.join(cell_dir, "w")
        os.environ["HOME"] = os.environ["TMPDIR"] = self.work
        self.stale = 0
        self.null = os.open("/dev/null", os.O_RDWR)
        self.codes = {}  # source -> code object, most recently used last

    def compiled(self, key, drop, text):
        """(code, source) of a call's source, compiled once per forker; the server keeps the keys and says which to
        drop. A source that does not compile gives code None: the call reports its SyntaxError."""
        if drop:
            self.codes.pop(drop, None)
        if text:
            source = text.decode("utf-8", errors="surrogateescape")
            try:
                code = compile(source, "<source>", "exec")
            except BaseException:  # noqa: BLE001 - the call compiles it again and reports why
                code = None
            else:
                warm_regexes(source)
            if key:
                self.codes[key] = (code, source)
            return code, source
        return self.codes[key]

    def sweep(self, pgid):
        """Kill every process the call started: all of this uid or PID namespace but this forker, else its group."""
        try:
            if self.contained:
                os.kill(-1, signal.SIGKILL)
            else:
                os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass

    def reap(self, pgid):
        """After a call: kill what it left running and, when contained, reap until no process but this forker is
        left (every orphan is its child), so that none counts against the next call's RLIMIT_NPROC."""
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
        """(header fields, text, function, payload), or None once the server closed the pipe; a kill left over
        from a call that ended meanwhile is skipped."""
        while True:
            kind = read_exact(self.ctl, 1)
            if kind is None:
                return None
            if kind == MSG_KILL:
                continue
            header = read_exact(self.ctl, RUN_HEADER.size)
            if header is None:
                return None
            fields = RUN_HEADER.unpack(header)
            text = read_exact(self.ctl, fields[3]) if fields[3] else b""
            rest = read_exact(self.ctl, fields[4])
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
            call_process(kind, text, code, function, payload, timeout, self, workdir, self.out_w,
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
            rmtree(workdir)
        if server_gone:
            os._exit(0)
        write_all(self.st, DONE + DONE_BODY.pack(status, how, duration))

    def watch(self, pid, pidfd, start, timeout):
        """Wait for call ``pid`` to end: ``(how, server_gone)``. It times out after ``timeout`` seconds of CPU time or
        ``wall_timeout_factor`` times that of wall clock (docs/sandbox.md); the CPU clock is read only once the
        wall clock passed allows the budget to be spent."""
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
            ready, _, _ = select.select([pidfd, self.ctl], [], [], max(min(wait, 1.0), 0.005))
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
                write_all(self.st, CELL_ERROR + struct.pack(">I", len(text)) + text)


def _keep_only(fds, ruleset):
    """Close every inherited descriptor but ``fds`` and the ruleset; 0-2 not kept point at /dev/null."""
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
    """The forker's process layer (root: the cell's own uid; else the cell's PID namespace) and what it does when
    the server dies."""
    if iso["uid"]:
        uid = iso["uid_base"] + cell
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        set_rlimit(resource.RLIMIT_NPROC, cfg.max_processes + 1)
        clean_uid(uid, os.getpid(), timeout=2.0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # a call's orphans become this forker's children
        # The server's death (told after setuid, which clears the setting): kill every process of the uid, exit.
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
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    elif iso.get("cell_namespaces"):
        # The forker is the init of the cell's PID namespace (enter_cell_namespaces). RLIMIT_NPROC counts the cell's
        # user namespace: its first process, this forker and a call's max_processes.
        if iso["pidns"]:
            set_rlimit(resource.RLIMIT_NPROC, cfg.max_processes + 2)
        drop_capabilities()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the cell's first process gone: all of it goes
    else:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _calls_interpreter(iso):
    """The interpreter state every call inherits: the standard library's path only, SIGXFSZ and SIGPIPE ignored,
    text streams on fds 0-2."""
    sys.path[:] = iso["sys_path"]
    sys.path_importer_cache.clear()
    # The packages loaded already find their submodules through ``__path__``, the standard library a cell's uid
    # cannot read: point it at the mirror (or ``import encodings.idna``, every codec not loaded yet, fails).
    old, new = os.path.join(STDLIB, ""), os.path.join(iso["sys_path"][0], "")
    for module in list(sys.modules.values()) if old != new else ():
        path = getattr(module, "__path__", None)
        if type(path) is list:  # the same list as the module's spec.submodule_search_locations
            path[:] = [new + p[len(old):] if p.startswith(old) else p for p in path]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sys.argv = ["<sandbox>"]
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)


def _calls_rlimits(cfg):
    """The calls' memory, file-size and descriptor limits, taken once by the forker and inherited."""
    mem = cfg.memory_mb << 20
    set_rlimit(resource.RLIMIT_AS, mem)
    set_rlimit(resource.RLIMIT_DATA, mem)
    set_rlimit(resource.RLIMIT_FSIZE, cfg.max_file_mb << 20)
    set_rlimit(resource.RLIMIT_NOFILE, cfg.max_open_files)


def cell_main(cfg, iso, cell, cell_dir, ruleset, fds):
    """Take the per-cell isolation layers, then fork calls. Never returns."""
    st = fds[1]
    try:
        os.setsid()
        _keep_only(fds, ruleset)
        os.chdir(cell_dir)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})  # HOME, TMPDIR: see Forker
        _take_cell_uid(cfg, iso, cell)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace by the calls (same uid)
        if ruleset is not None:
            Landlock.restrict(ruleset)
        set_rlimit(resource.RLIMIT_CORE, 0)
        _calls_interpreter(iso)
        forker = Forker(cfg, iso, cell_dir, ruleset, fds)
        _calls_rlimits(cfg)
        # Everything alive now is shared with every call: the collector must not walk (and so copy) it.
        gc.collect()
        gc.freeze()
    except BaseException:  # noqa: BLE001
        try:
            text = traceback.format_exc()[-2000:].encode()
            write_all(st, FATAL + struct.pack(">I", len(text)) + text)
        finally:
            os._exit(70)
    forker.serve()
    os._exit(0)
