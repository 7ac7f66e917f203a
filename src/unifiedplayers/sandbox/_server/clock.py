"""The calendar clock and random generators of a call, virtual and seeded (``sandbox.deterministic``,
:func:`deterministic_call`; docs/sandbox.md)."""
import datetime
import os
import random
import time

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


def deterministic_call(on, seed=0):
    """Runs in each call before its code when ``on`` (sandbox.deterministic): the calendar clock starts at
    VIRTUAL_EPOCH + ``seed`` seconds and advances VIRTUAL_TICK per reading and by what the call sleeps; ``random``,
    unseeded ``Random()``s and ``os.urandom``/``getrandom`` draw from ``seed``. What stays real: docs/sandbox.md.
    Each replacement is a staticmethod, so that one stored as a class attribute does not bind (as built-ins)."""
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
