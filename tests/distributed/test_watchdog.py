"""A rank that hangs or fails ends a two-rank job (gloo, torchrun) quickly and is named in the log, while a long
stage of rank 0 alone does not end it (src/unifiedplayers/watchdog.py). The jobs run a worker that only runs
collectives (watchdog_worker.py), with a hang limit of LIMIT_S seconds; a process group timeout of 30 s (or twice
the limit) stands behind it, so that a watchdog that does not work makes these tests fail rather than hang.

The ranks are started with torchrun as in launch.py, by hand: the tests need the ranks' pids and the time the job
takes to end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unifiedplayers import watchdog
from unifiedplayers.distributed import without_rendezvous
from tests.distributed.launch import SRC, free_port  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("watchdog_worker.py")
LIMIT_S = float(os.environ.get("WATCHDOG_TEST_LIMIT_S", 6))  # 120 remakes docs/distributed.md's default row


def launch(mode: str, out: Path, steps: int, **env: str) -> subprocess.Popen:
    """``torchrun --nproc_per_node=2 watchdog_worker.py MODE OUT STEPS``, its output (both streams) on a pipe."""
    full = without_rendezvous({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC,
                               watchdog.LIMIT_ENV: str(LIMIT_S), "UNIFIEDPLAYERS_DIST_TIMEOUT_MIN": str(max(0.5, LIMIT_S / 30)), **env})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(WORKER), mode, str(out), str(steps)]
    return subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout: float = 120) -> None:
    """Until both ranks have finished ``step``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            if all(int((out / f"rank{r}.step").read_text() or -1) >= step for r in (0, 1)):
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the job did not reach step {step}:\n{proc.communicate()[0][-4000:]}")


def finish(proc: subprocess.Popen, timeout: float = LIMIT_S + 120) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the job did not end within {timeout} s:\n{proc.communicate()[0][-4000:]}")


def test_the_default_limit_ends_a_hung_rank_within_five_minutes():
    assert watchdog.limit_from_env({}) == watchdog.DEFAULT_LIMIT_S <= 240  # plus a pulse and torchrun's teardown
    assert watchdog.limit_from_env({watchdog.LIMIT_ENV: "0"}) == 0  # off


@pytest.mark.parametrize("stopped", [1, 0])
def test_a_stopped_rank_ends_the_job_and_is_named(tmp_path, stopped):
    proc = launch("beat", tmp_path, steps=1000)
    wait_for_step(proc, tmp_path, 2)
    pid = int((tmp_path / f"rank{stopped}.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    at = time.monotonic()
    try:
        log = finish(proc)
    finally:
        try:  # a watchdog that did not kill it leaves it stopped
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = time.monotonic() - at
    print(f"SIGSTOP on rank {stopped}: the job ended {took:.1f} s later")
    assert proc.returncode != 0
    named = f"[watchdog, rank {1 - stopped}] rank {stopped} has not answered for"
    assert named in log and f"(hung or stopped); killed its process {pid} on this machine; ending the job" in log, \
        log[-4000:]
    # Silence counts from the last beat seen, which may precede the stop by one pulse (watchdog.Watchdog.interval_s).
    assert LIMIT_S - min(5.0, LIMIT_S / 8) <= took < LIMIT_S + 15, log[-4000:]


@pytest.mark.parametrize("failing", [1, 0])
def test_a_rank_that_raises_ends_the_job_with_its_error(tmp_path, failing):
    proc = launch(f"raise{failing}", tmp_path, steps=1000)
    log = finish(proc)
    took = time.time() - float((tmp_path / "raised").read_text())
    print(f"rank {failing} raised: the job ended {took:.1f} s later")
    assert proc.returncode != 0
    error = f"RuntimeError: planted failure on rank {failing} at step 3"
    assert f"[rank {failing}] failed: {error}; leaving the job" in log, log[-4000:]
    assert "Traceback" in log and error in log
    # The failing rank's process stays up (a thread that is not a daemon): the other rank ends on its note.
    assert f"[watchdog, rank {1 - failing}] rank {failing}: {error}; ending the job" in log, log[-4000:]
    assert took < 20, log[-4000:]


def test_ranks_at_collectives_that_do_not_match_end_the_job_and_are_named(tmp_path):
    proc = launch("mismatch", tmp_path, steps=1000)
    wait_for_step(proc, tmp_path, 2)
    at = time.monotonic()
    log = finish(proc)
    took = time.monotonic() - at
    print(f"rank 0 gathers while rank 1 waits at a broadcast: the job ended {took:.1f} s later")
    assert proc.returncode != 0
    assert (f"at collectives that do not match: rank 0 at gather (its collective 4), rank 1 at broadcast (its "
            "collective 4); ending the job") in log, log[-4000:]
    assert took < LIMIT_S + 15, log[-4000:]


def test_a_long_stage_of_rank_0_alone_does_not_end_the_job(tmp_path):
    solo = 2 * LIMIT_S
    start = time.monotonic()
    proc = launch("solo", tmp_path, steps=5, SOLO_S=str(solo))
    log = finish(proc)
    took = time.monotonic() - start
    print(f"rank 0 alone for {solo:.0f} s: the job took {took:.1f} s")
    assert proc.returncode == 0 and "[watchdog" not in log and "failed" not in log, log[-4000:]
    assert log.count("[worker] watchdog on") == 2, log[-4000:]
    assert took > solo
    assert (tmp_path / "rank1.step").read_text() == "4"
