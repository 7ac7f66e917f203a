"""The watchdog's rules, in one process (src/unifiedplayers/watchdog.py): when a rank counts as silent, what the
watcher does after a pause of its own, and which process it may kill. The two-rank jobs are in test_watchdog.py."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from unifiedplayers import watchdog
from unifiedplayers.watchdog import LEFT, Watchdog

pytestmark = [pytest.mark.cpu]


class Recorded(Watchdog):
    """A watchdog whose end is recorded instead of ending the test's process."""

    ended: list

    def _end(self, reason, culprit, post):
        self.ended.append((reason, culprit))
        self._stop.set()


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def test_silence_counts_between_reads_and_a_watcher_that_slept_counts_again(store):
    w = Watchdog(store, rank=0, world_size=3, limit_s=10)
    now = 100.0
    w._read_at, w._moved, w._counts = now, {1: now - 5, 2: now - 11}, {1: 7, 2: 3}
    assert w._verdict(now, paused=False) == ("rank 2 has not answered for 11 s (hung or stopped)", 2, True)
    w._counts[2] = LEFT  # rank 2 left the job cleanly: not watched any more
    assert w._verdict(now, paused=False) is None
    # The reads stopped at 100 (the store did not answer): the ranks are not blamed for it, the store is.
    w._counts[2], w._moved[2] = 3, now - 5
    reason, culprit, post = w._verdict(now + 20, paused=False)
    assert reason.startswith("the job's store at") and "has not answered for 20 s" in reason
    assert culprit is None and not post  # nothing to kill, and no note to a store that does not answer
    # This watcher was paused (stopped, starved): everyone starts counting again from now.
    assert w._verdict(now + 20, paused=True) is None
    assert w._moved == {1: now + 20, 2: now + 20} and w._read_at == now + 20
    assert w._verdict(now + 29, paused=False) is None


def test_collectives_that_do_not_match_end_the_job_only_when_every_rank_waits_past_the_limit(store):
    w = Watchdog(store, rank=0, world_size=3, limit_s=10)
    now = 100.0
    w._read_at, w._counts = now, {1: 1, 2: 1}
    w._moved = {1: now, 2: now}
    w._place = ("7 gather", now - 11)
    w._places = {1: ("7 broadcast", now - 12), 2: ("7 broadcast", now - 11)}
    reason, culprit, post = w._verdict(now, paused=False)
    assert reason == ("the ranks have waited for over 10 s at collectives that do not match: rank 0 at gather "
                      "(its collective 7), rank 1 at broadcast (its collective 7), rank 2 at broadcast (its "
                      "collective 7)") and culprit is None and post
    w._places[2] = ("7 broadcast", now - 9)  # rank 2 has waited there for less than the limit
    assert w._verdict(now, paused=False) is None
    w._places[2] = ("", now - 30)  # rank 2 works (rank 0's solo stage, seen from the others)
    assert w._verdict(now, paused=False) is None
    w._place, w._places[2] = ("7 broadcast", now - 11), ("7 broadcast", now - 11)
    assert w._verdict(now, paused=False) is None  # all at one collective: slow, not mismatched
    w._places[2] = ("8 broadcast", now - 11)
    assert w._verdict(now, paused=False) is None  # broadcasts pair up whatever their counts
    w._place, w._places[2] = ("7 gather", now - 11), ("8 broadcast", now - 11)
    w._counts[2] = LEFT  # a rank that left is not waited for
    assert "rank 0 at gather (its collective 7), rank 1 at broadcast" in w._verdict(now, paused=False)[0]


def test_a_failure_note_stands_first_and_ends_the_others(store):
    a, b = Watchdog(store, 0, 2, limit_s=10), Watchdog(store, 1, 2, limit_s=10)
    assert b.post_failure("RuntimeError: boom") == "rank 1: RuntimeError: boom"
    assert a.post_failure("RuntimeError: Connection closed by peer") == "rank 1: RuntimeError: boom"
    a._failure = "rank 1: RuntimeError: boom"
    assert a._verdict(time.monotonic(), paused=False) == ("rank 1: RuntimeError: boom", None, False)


def test_two_pulses_over_one_store_end_on_silence_not_on_leaving(store):
    Recorded.ended = []
    a = Recorded(store, 0, 2, limit_s=0.8).start()
    b = Recorded(store, 1, 2, limit_s=0.8).start()
    time.sleep(1.5)
    assert Recorded.ended == []  # both beat
    b._stop.set()  # rank 1's threads stop without leaving: as a stopped process looks from outside
    deadline = time.monotonic() + 5
    while not Recorded.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Recorded.ended and Recorded.ended[0][1] == 1 and "rank 1 has not answered" in Recorded.ended[0][0]
    a.stop()

    Recorded.ended = []
    store2 = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    a, b = Recorded(store2, 0, 2, limit_s=0.8).start(), Recorded(store2, 1, 2, limit_s=0.8).start()
    b.stop()  # rank 1 left cleanly
    time.sleep(2)
    a.stop()
    assert Recorded.ended == []


def test_without_a_store_the_run_goes_on_without_a_watchdog_and_says_so(capsys):
    with socket.socket() as s:  # a port nobody listens at
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), watchdog.LIMIT_ENV: "1"}
    assert watchdog.start(1, 2, env) is None
    assert "[watchdog, rank 1] not started, no store at 127.0.0.1:" in capsys.readouterr().err
    assert watchdog.start(1, 2, {**env, watchdog.LIMIT_ENV: "0"}) is None  # off: not even tried


def test_only_the_named_process_of_this_machine_is_killed():
    assert watchdog.process_identity()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        proc.send_signal(signal.SIGSTOP)
        identity = watchdog.process_identity(proc.pid)
        boot, namespace, pid, start = identity.split()
        assert watchdog.kill_if_local(f"another-boot {namespace} {pid} {start}") is None  # another machine
        assert watchdog.kill_if_local(f"{boot} {namespace} {pid} {int(start) + 1}") is None  # the pid, reused
        assert proc.poll() is None
        assert watchdog.kill_if_local(identity) == proc.pid
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
