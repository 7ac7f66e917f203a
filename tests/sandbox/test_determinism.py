"""What a call gives does not depend on the run or the load.

- Its limit is CPU time, not wall clock: whether a call times out does not depend on what else the machine runs.
  A wall-clock cap, ``wall_timeout_factor`` times the limit, still ends a call that sleeps or blocks.
- A call that floods its output is "output exceeded" whether it ended before the kill or not.
- Every server hashes strings alike (PYTHONHASHSEED=0): a set of strings prints in one order in every run.
- Every call reads one virtual clock and starts from one random seed (``sandbox.deterministic``): code that prints
  the time, a duration or a random number prints the same in every run."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from unifiedplayers.sandbox import Sandbox, SandboxConfig

pytestmark = pytest.mark.cpu

# Spins on the real CPU clock (deterministic=False: a call's own clocks are real, not virtual).
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {cpu}:\n    pass\nprint('done')"


def _burn(stop):
    os.setsid()  # a session of its own: with autogrouped scheduling, CPU is shared between sessions, not processes
    while not stop.is_set():
        pass


@pytest.fixture
def one_crowded_core():
    """This process, the sandbox it starts and three CPU burners, each in its own session, all on one core: a call
    gets about a quarter of it."""
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(3)]
    for b in burners:
        b.start()
    try:
        yield
    finally:
        stop.set()
        for b in burners:
            b.join(5)
            if b.is_alive():
                b.kill()
        os.sched_setaffinity(0, before)


def test_a_call_within_its_cpu_budget_finishes_on_a_crowded_core(one_crowded_core):
    """0.3 s of CPU against a 0.6 s limit: on a quarter of a core that takes about 1.2 s of wall clock, which a
    wall-clock limit of 0.6 s would have cut (a timeout on a loaded machine, a result on a quiet one)."""
    with Sandbox(SandboxConfig(timeout_s=0.6, wall_timeout_factor=10, workers=1, deterministic=False)) as box:
        r = box.run(SPIN.format(cpu=0.3))
    assert (r.timed_out, r.exit_code, r.stdout) == (False, 0, "done\n"), r
    assert r.duration_s > 0.6  # the wall clock did pass the limit: the load was real


def test_a_call_over_its_cpu_budget_times_out_on_a_crowded_core(one_crowded_core):
    with Sandbox(SandboxConfig(timeout_s=0.3, wall_timeout_factor=20, workers=1, deterministic=False)) as box:
        r = box.run(SPIN.format(cpu=5.0))
        c = box.call("def check(t):\n    while True:\n        pass", "check", None)
    assert r.timed_out and r.exit_code == -9 and r.stdout == "" and r.duration_s > 0.3
    assert c.timed_out and not c.ok and c.error == "timed out after 0.3 s"


def test_a_sleeping_call_is_ended_by_the_wall_clock_cap():
    with Sandbox(SandboxConfig(timeout_s=0.2, wall_timeout_factor=3, workers=1)) as box:
        t0 = time.monotonic()
        r = box.run("import time\ntime.sleep(60)")
        wall = time.monotonic() - t0
        quick = box.run("import time\ntime.sleep(0.3)\nprint('woke')")  # over 0.2 s of wall, no CPU: finishes
    assert r.timed_out and 0.6 <= r.duration_s < 5 and wall < 10
    assert not quick.timed_out and quick.stdout == "woke\n"


def test_a_flood_is_output_exceeded_whether_or_not_it_ended_before_the_kill():
    with Sandbox(SandboxConfig(timeout_s=5, max_output_bytes=1000, workers=1)) as box:
        # 5 MB in one write, then exit at once: the process is usually gone before the server reads a byte
        results = [box.run("import sys\nsys.stdout.write('x' * (5 << 20))\nsys.stdout.flush()") for _ in range(3)]
    assert all(r.output_exceeded and not r.ok and len(r.stdout) == 1000 for r in results), results


def test_every_server_iterates_a_set_of_strings_in_one_order():
    code = "print(list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'}))"
    outputs = set()
    for _ in range(3):
        with Sandbox(SandboxConfig(workers=1)) as box:
            outputs.add(box.run(code).stdout)
            assert box.call("def f(x):\n    return ''.join(sorted(set(x)) + list(set(x)))", "f", "banana").ok
    assert len(outputs) == 1, outputs


CLOCK_AND_RANDOM = """
import datetime, os, pickle, random, tempfile, time, uuid
t0 = time.time()
time.sleep(0.05)
print(t0, round(time.time() - t0, 3), time.ctime(), time.strftime('%Y'), time.clock_gettime(time.CLOCK_REALTIME))
print(datetime.datetime.now().year, repr(datetime.datetime(2020, 1, 2)), datetime.date.today(),
      pickle.loads(pickle.dumps(datetime.datetime.min)) == datetime.datetime.min)
print(random.random(), random.Random().random(), uuid.uuid4(), os.urandom(4).hex(), os.getrandom(2).hex(),
      os.path.basename(tempfile.mktemp()))
"""

# What the standard library does with its clocks keeps working under the virtual calendar clock.
STDLIB_CLOCKS = """
import asyncio, logging, queue, sys, threading, time
t0 = time.monotonic()
try:
    queue.Queue().get(timeout=0.2)
except queue.Empty:
    pass
threading.Condition().acquire()
asyncio.run(asyncio.sleep(0.05))
class T:
    now = time.time
    local = time.localtime
T().now(); T().local()
logging.basicConfig(stream=sys.stdout, format='%(asctime)s %(message)s', level=logging.INFO)
logging.info('logged')
print(round(time.monotonic() - t0, 1) < 2)
"""


def test_the_standard_library_keeps_its_real_deadlines_and_binds_no_clock():
    with Sandbox(SandboxConfig(workers=1, timeout_s=5)) as box:
        r = box.run(STDLIB_CLOCKS)
    assert r.exit_code == 0 and not r.timed_out, r
    assert r.stdout.splitlines() == ["2026-01-01 00:00:00,000 logged", "True"], r.stdout + r.stderr


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_call_reads_one_virtual_clock_and_one_seed_in_every_run(deterministic):
    outputs = []
    for _ in range(2):
        with Sandbox(SandboxConfig(workers=1, deterministic=deterministic)) as box:
            r = box.run(CLOCK_AND_RANDOM)
            assert r.exit_code == 0, r.stderr
            outputs.append(r.stdout)
    first = outputs[0].splitlines()
    if deterministic:
        assert outputs[0] == outputs[1]
        assert first[0] == "1767225600.000001 0.05 Thu Jan  1 00:00:00 2026 2026 1767225600.050005"  # slept 0.05 s
        assert first[1] == "2026 datetime.datetime(2020, 1, 2, 0, 0) 2026-01-01 True"
        assert first[2].startswith(str(__import__("random").Random(0).random()))
    else:  # the real clock and fresh seeds: another time, other random numbers
        assert outputs[0] != outputs[1] and not first[0].startswith("1767225600.0")


def test_a_request_seed_moves_the_clock_and_the_random_state():
    """Two seeds differ (a nondeterminism check runs a program under two), one seed repeats in every run."""
    with Sandbox(SandboxConfig(workers=2)) as box:
        runs = box.run_many([CLOCK_AND_RANDOM] * 4, seeds=[0, 1, 1, 0])
        with pytest.raises(ValueError, match="2 seeds for 3 programs"):
            box.run_many(["print(1)"] * 3, seeds=[0, 1])
    out = [r.stdout for r in runs]
    assert out[0] == out[3] and out[1] == out[2] and out[0] != out[1]
    assert out[1].startswith("1767225601.000001 ")  # seed 1: the clock starts a second later
    assert out[1].splitlines()[2].startswith(str(__import__("random").Random(1).random()))
