"""The server: dispatch the client's requests to free cells, read each call's output and answer, watch the forkers
(:class:`Server`); :func:`main` is the entry point (``__main__``)."""
import collections
import fcntl
import gc
import os
import select
import signal
import struct
import time
import traceback

from .files import rmtree
from .forker import cell_main
from .framing import CODE_CACHE_ENTRIES, CODE_CACHE_MAX_SOURCE, DONE, DONE_BODY, ENDED, FATAL, FrameReader, KILLED, KIND_CALL, KIND_RUN, MSG_KILL, MSG_RUN, RUN_HEADER, read_frame, send, write_all
from .kernel import PR_SET_CHILD_SUBREAPER, libc
from .layers import take_isolation
from .namespaces import enter_cell_namespaces
from .results import build_result
from .settings import Settings
from .uids import clean_uid

class Cell:
    """The server's side of one cell: the forker's pipes and the call it is running, if any."""

    __slots__ = ("index", "pid", "pidfd", "ctl", "st", "out", "err", "res", "stbuf", "req", "deadline",
                 "bufs", "totals", "kill_sent", "cached")


class Server:
    grace = 5.0  # beyond a call's own timeout, before its cell worker is declared stuck

    def __init__(self, cfg):
        self.cfg = cfg
        # Two cells per core: the second keeps the core busy while the server answers the first's call.
        self.workers = cfg.workers
        self.timeout = cfg.timeout_s
        self.wall_factor = cfg.wall_timeout_factor or 1.0
        self.limit = cfg.max_output_bytes
        self.value_limit = cfg.max_value_bytes
        self.flood = max(64 * self.limit, 4 << 20)  # bytes of one stream after which a call is killed
        self.root = cfg.workdir_root
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)
        iso, landlock = take_isolation(cfg, self.root, self.claim_uids)
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
        """The first uid of a block no other live sandbox server on this machine uses: each holds a lock on its block
        (in ``client.uid_lock_root``) for its lifetime, so that one server's sweeps never touch another's calls."""
        block = max(64, self.workers)
        for k in range(4096):
            lock_dir = cfg.uid_lock_root or cfg.mirror_root
            fd = os.open(os.path.join(lock_dir, "uids-%d.lock" % k), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid_lock = fd
            return cfg.uid_base + k * block
        raise RuntimeError("no free block of sandbox uids")

    def spawn(self, i):
        (ctl_r, ctl_w), (st_r, st_w), (out_r, out_w), (err_r, err_w), (res_r, res_w) = (os.pipe() for _ in range(5))
        pid = os.fork()
        if pid == 0:
            if self.iso["cell_namespaces"]:
                enter_cell_namespaces(st_w)  # returns in the forker, PID 1 of the cell's namespace
            cell_main(self.cfg, self.iso, i, self.cell_dirs[i], self.rulesets[i],
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
            # The cell's first process kills the forker, the namespace's init, and exits after it: none is left.
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
            clean_uid(self.iso["uid_base"] + s.index)
        for fd in (s.pidfd, s.ctl, s.st, s.out, s.err, s.res):
            os.close(fd)
        for name in os.listdir(self.cell_dirs[s.index]):
            rmtree(os.path.join(self.cell_dirs[s.index], name))
        if s.req is not None:
            send({"id": s.req["id"], "exit_code": -signal.SIGKILL, "ok": False, "stdout": "", "stderr": "",
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
                    # Keys only grow: a forgotten key is never reused, and a forker caching it drops it in its turn.
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
            write_all(s.ctl, MSG_RUN + header + text + rest)
        except OSError:
            self.replace(s, "sandbox cell worker died")

    def read_output(self, s, k):
        """Read pipe ``k`` (0 stdout, 1 stderr, 2 result) of cell ``s``; False once it is empty. Bytes beyond the
        limits are counted, not kept; a flood is stopped."""
        fd = (s.out, s.err, s.res)[k]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
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
                write_all(s.ctl, MSG_KILL)
            except OSError:
                pass
        return True

    def on_status(self, s):
        """Messages from a forker: the end of its call (answered here), or a failure."""
        try:
            chunk = os.read(s.st, 1 << 16)
        except BlockingIOError:
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
                send({"id": req["id"], "exit_code": -signal.SIGKILL, "ok": False, "stdout": "",
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
        result = build_result(req, self.limit, self.value_limit, s.bufs, s.totals, status, how, duration, timeout)
        result["id"] = req["id"]
        s.req = s.bufs = None
        send(result)

    def serve(self):
        send({"ready": True, "isolation": self.iso, "pid": os.getpid()})
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
            ready = set(select.select(rl, [], [], wait)[0])
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
        rmtree(self.root)

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
    message = read_frame(0)
    if message is None:
        return
    try:
        cfg = Settings(message)
        server = Server(cfg)
    except BaseException:  # noqa: BLE001
        send({"ready": False, "error": traceback.format_exc()})
        return
    if cfg.require_isolation:
        process = "pidns" if server.iso["mechanism"] == "user namespace" else "uid"
        missing = [k for k in ("netns", process, "landlock") if not server.iso.get(k)]
        if missing:
            send({"ready": False, "error": "isolation layers unavailable: %s (%s)"
                   % (", ".join(missing), "; ".join(server.iso["notes"]))})
            return
    if server.iso["uid"]:  # a dead forker's orphans come to the server, which reaps them (clean_uid)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    gc.collect()
    gc.freeze()  # what start-up built lasts as long as the server: the collector need not walk it again
    server.serve()
