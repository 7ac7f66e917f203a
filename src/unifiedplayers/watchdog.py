"""A rank that hangs or fails ends the whole job within minutes, and the log names it (docs/distributed.md,
"A rank that hangs or fails", says what counts as silence and what is not caught).

Every rank runs two daemon threads, started by :func:`unifiedplayers.distributed.init_distributed`: the **pulse**
adds 1 to this rank's counter in the job's key-value store (torchrun's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``)
and reads the other ranks' counters, the collectives they wait at (:meth:`Watchdog.at_collective`) and the job's
failure note (:meth:`Watchdog.post_failure`); the **watch** ends this process (``os._exit``, so that torchrun tears
the job down), naming the rank, when another rank's counter has not moved for ``UNIFIEDPLAYERS_HANG_LIMIT_S``
seconds, when the store has not answered for as long, when the ranks wait at collectives that do not match, or
when another rank has posted a failure.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator, Mapping, Optional

LIMIT_ENV = "UNIFIEDPLAYERS_HANG_LIMIT_S"
DEFAULT_LIMIT_S = 120.0
EXIT_CODE = 3  # this rank ended the job because another rank hung or failed
LEFT = -1  # a rank's counter once it has left the job cleanly


def limit_from_env(env: Mapping[str, str] = os.environ) -> float:
    """Seconds of silence after which a rank counts as hung; 0 turns the watchdog off."""
    value = float(env.get(LIMIT_ENV, DEFAULT_LIMIT_S))
    if value < 0:
        raise ValueError(f"{LIMIT_ENV}={value}: a number of seconds, or 0 for no watchdog")
    return value


def process_identity(pid: Optional[int] = None) -> str:
    """``boot pid-namespace pid start-time`` of a process on this machine: equal only for the same process (a pid
    reused later, another machine or another container differ). Empty where ``/proc`` cannot tell."""
    pid = os.getpid() if pid is None else pid
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]  # field 22, the start time in clock ticks
    except (OSError, IndexError):
        return ""
    return f"{boot} {namespace} {pid} {start}"


def kill_if_local(identity: str) -> Optional[int]:
    """SIGKILL the process ``identity`` (:func:`process_identity`) names if it is on this machine; its pid, or None."""
    if not identity:
        return None
    pid = int(identity.split()[2])
    if process_identity(pid) != identity:
        return None
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return None
    return pid


class Watchdog:
    """This rank's pulse and its watch over the other ranks (module docstring). ``store`` is a client of the job's
    key-value store of its own (the threads' requests never queue behind the main thread's)."""

    def __init__(self, store: Any, rank: int, world_size: int, limit_s: float, interval_s: Optional[float] = None,
                 prefix: str = "unifiedplayers/watchdog") -> None:
        self.store, self.rank, self.world_size, self.limit_s = store, rank, world_size, limit_s
        self.interval_s = interval_s or min(5.0, limit_s / 8)
        self.prefix = prefix
        self.others = [r for r in range(world_size) if r != rank]
        now = time.monotonic()
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}
        self._moved = dict.fromkeys(self.others, now)  # when each rank's counter was last seen to move
        self._read_at = now  # the last read of the store that succeeded
        self._failure: Optional[str] = None
        self._calls = 0  # the collectives this rank has entered
        self._place = ("", now)  # the collective this rank waits at ("<n> <name>", "" outside one), and since when
        self._places: dict[int, tuple[str, float]] = {}  # the others', and since when this rank has read it
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _key(self, kind: str, rank: Optional[int] = None) -> str:
        return f"{self.prefix}/{kind}" + ("" if rank is None else f"/{rank}")

    def start(self) -> "Watchdog":
        self.store.set(self._key("identity", self.rank), process_identity())
        for r in range(self.world_size):  # every key exists before anyone reads them all
            self.store.add(self._key("beat", r), 0)
            self.store.compare_set(self._key("place", r), "", "")  # never overwrites a rank's own
        for name, target in (("pulse", self._pulse), ("watch", self._watch)):
            thread = threading.Thread(target=target, name=f"unifiedplayers-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Leave cleanly: the others stop watching this rank."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * self.interval_s)  # a pulse blocked on a store that does not answer stays behind
        try:
            self.store.set(self._key("beat", self.rank), str(LEFT))
        except Exception:  # noqa: BLE001 - the store is gone: so is the job, and nobody watches this rank
            pass

    def post_failure(self, text: str) -> str:
        """Post ``rank <r>: <text>`` as the job's failure note unless another rank posted first; returns the note
        that stands."""
        note = f"rank {self.rank}: {text}"
        return self.store.compare_set(self._key("failure"), "", note).decode()

    @contextmanager
    def at_collective(self, name: str) -> Iterator[None]:
        """Note, for the other ranks, that this rank waits at its next collective, ``name``."""
        self._calls += 1
        self._place = (f"{self._calls} {name}", time.monotonic())
        try:
            yield
        finally:
            self._place = ("", time.monotonic())

    # ------------------------------------------------------------------ the two threads
    def _pulse(self) -> None:
        keys = [self._key(kind, r) for kind in ("beat", "place") for r in self.others]
        published = None
        while not self._stop.is_set():
            try:
                self.store.add(self._key("beat", self.rank), 1)
                place = self._place[0]
                if place != published:
                    self.store.set(self._key("place", self.rank), place)
                    published = place
                values = [v.decode() for v in self.store.multi_get(keys)] if keys else []
                failure = self.store.get(self._key("failure")).decode() \
                    if self.store.check([self._key("failure")]) else None
            except Exception:  # noqa: BLE001 - the store did not answer: the watch counts how long
                self._stop.wait(self.interval_s)
                continue
            self._read(values[:len(self.others)], values[len(self.others):], failure)
            self._stop.wait(self.interval_s)

    def _read(self, counts: list[str], places: list[str], failure: Optional[str]) -> None:
        """What one pulse read of the other ranks: their counters, the collectives they wait at, the failure note."""
        now = time.monotonic()
        with self._lock:
            for r, count, place in zip(self.others, counts, places):
                if int(count) != self._counts.get(r):
                    self._counts[r], self._moved[r] = int(count), now
                if place != self._places.get(r, ("", 0.0))[0]:
                    self._places[r] = (place, now)
            self._read_at, self._failure = now, failure

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            reason = self._verdict(now, paused=now - last > self.interval_s + self.limit_s / 4)
            last = now
            if reason is not None:
                self._end(*reason)

    def _verdict(self, now: float, paused: bool) -> Optional[tuple[str, Optional[int], bool]]:
        """Why this rank must end the job, the rank to blame (``None`` when there is none to kill), and whether to
        post the reason for the other ranks (not their own note, nor to a store that does not answer)."""
        with self._lock:
            if paused:  # this process slept, not the others: start counting again
                self._read_at = now
                self._moved = dict.fromkeys(self.others, now)
                self._places = {r: (place, now) for r, (place, _) in self._places.items()}
                return None
            if self._failure:
                return self._failure, None, False
            for r in self.others:
                silent = self._read_at - self._moved[r]
                if self._counts.get(r) != LEFT and silent > self.limit_s:
                    return f"rank {r} has not answered for {silent:.0f} s (hung or stopped)", r, True
            if now - self._read_at > self.limit_s:
                return (f"the job's store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} has "
                        f"not answered for {now - self._read_at:.0f} s (its host hung or stopped)", None, False)
            mismatch = self._mismatch(now)
        return (mismatch, None, True) if mismatch else None

    def _mismatch(self, now: float) -> Optional[str]:
        """Every rank has waited longer than the limit at a collective, and not all at the same kind (two broadcasts
        pair up whatever their counts): none can return. ``None`` otherwise."""
        place, since = self._place
        places = {self.rank: (place, now - since)}
        for r in self.others:
            if self._counts.get(r) != LEFT:
                other, seen = self._places.get(r, ("", now))
                places[r] = (other, self._read_at - seen)
        names = {p.partition(" ")[2] for p, _ in places.values()}  # the counts differ after a call seen on one
        if any(not p or waited <= self.limit_s for p, waited in places.values()) or len(names) == 1:  # side only
            return None
        where = ", ".join(f"rank {r} at {p.partition(' ')[2]} (its collective {p.partition(' ')[0]})"
                          for r, (p, _) in sorted(places.items()))
        return f"the ranks have waited for over {self.limit_s:.0f} s at collectives that do not match: {where}"

    def _end(self, reason: str, culprit: Optional[int], post: bool) -> None:
        """Print ``reason``, kill the silent rank if it is on this machine, post the reason and end this process."""
        pid = None
        try:
            if culprit is not None:
                pid = kill_if_local(self.store.get(self._key("identity", culprit)).decode())
            if post:
                self.post_failure(reason)
        except Exception:  # noqa: BLE001 - ending the job matters more than the note
            pass
        if pid is not None:
            reason += f"; killed its process {pid} on this machine"
        print(f"[watchdog, rank {self.rank}] {reason}; ending the job", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_CODE)


def start(rank: int, world_size: int, env: Mapping[str, str] = os.environ) -> Optional[Watchdog]:
    """This rank's watchdog over the job whose store is at ``MASTER_ADDR:MASTER_PORT``; ``None`` when it is off or the
    job has no such store (the run goes on without one, and says so)."""
    limit = limit_from_env(env)
    if limit == 0 or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    import torch.distributed as dist

    attempt = f"{env.get('TORCHELASTIC_RUN_ID', 'job')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=limit))
        return Watchdog(store, rank, world_size, limit, prefix=f"unifiedplayers/watchdog/{attempt}").start()
    except Exception as err:  # noqa: BLE001 - a safety net, not a condition of the run
        print(f"[watchdog, rank {rank}] not started, no store at {env['MASTER_ADDR']}:{env['MASTER_PORT']} ({err}); "
              "a hung rank ends the job at the process group's timeout", file=sys.stderr, flush=True)
        return None
