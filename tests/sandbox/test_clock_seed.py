"""Each reading of the calendar clock and each random source a call has, one at a time, under
``sandbox.deterministic``: the clock starts at 2026-01-01 00:00:00 UTC plus the request's seed in seconds, whichever
function reads it (with no argument, as model-written code calls them); ``os.urandom``, ``os.getrandom``,
``uuid4`` and ``secrets`` repeat for one seed and differ between two."""
from __future__ import annotations

import pytest

from unifiedplayers.sandbox import Sandbox, SandboxConfig

pytestmark = pytest.mark.cpu

# One line per reading: the struct_time's fields up to the second (the clock advances 1 µs a reading, and sleeps
# nothing here, so every reading is within the call's first second).
CLOCK = """
import datetime, time, warnings
warnings.simplefilter('ignore')  # datetime.utcnow is deprecated, and still called
print('gmtime', tuple(time.gmtime())[:6])
print('localtime', tuple(time.localtime())[:6] == tuple(time.localtime(int(time.time())))[:6],
      time.localtime().tm_year)
print('utcnow', datetime.datetime.utcnow().replace(microsecond=0).isoformat())
print('now_utc', datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat())
print('today', datetime.date.today().isoformat() == datetime.date.fromtimestamp(time.time()).isoformat())
print('ctime', time.ctime() == time.asctime(time.localtime(int(time.time()))), time.gmtime(0)[:3])
"""

RANDOM = """
import os, secrets, uuid
print(os.urandom(8).hex(), os.getrandom(8).hex(), uuid.uuid4(), secrets.token_hex(8))
"""


@pytest.fixture(scope="module")
def box():
    with Sandbox(SandboxConfig(workers=1, deterministic=True)) as sandbox:
        yield sandbox


def _lines(result) -> dict[str, str]:
    assert result.exit_code == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


@pytest.mark.parametrize("seed", [0, 1])
def test_every_calendar_reading_with_no_argument_is_the_virtual_clock(box, seed):
    [r] = box.run_many([CLOCK], seeds=[seed])
    out = _lines(r)
    assert out["gmtime"] == str((2026, 1, 1, 0, 0, seed))
    assert out["utcnow"] == f"2026-01-01T00:00:{seed:02d}"
    assert out["now_utc"] == f"2026-01-01T00:00:{seed:02d}+00:00"
    # local time is the virtual instant in the server's time zone: the same fields as localtime(that instant)
    assert out["localtime"] in ("True 2026", "True 2025")  # 2025 west of UTC
    assert out["today"] == "True" and out["ctime"] == "True (1970, 1, 1)"  # an argument is still read


def test_random_bytes_repeat_for_one_seed_and_differ_between_two(box):
    runs = box.run_many([RANDOM] * 4, seeds=[0, 1, 1, 0])
    out = [r.stdout.split() for r in runs]
    assert all(r.exit_code == 0 for r in runs), [r.stderr for r in runs]
    assert out[0] == out[3] and out[1] == out[2]  # one seed: the same bytes in every call
    for a, b in zip(out[0], out[1]):  # two seeds: every source differs
        assert a != b
