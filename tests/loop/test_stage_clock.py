"""The stage clock: each stage's exclusive wall time, nested stages left out of the one they run in."""
import pytest

from unifiedplayers.diagnostics import timing
from unifiedplayers.diagnostics.timing import StageClock
from unifiedplayers.loop.engines import TimedSandbox


@pytest.fixture
def fake_time(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    return now


def test_nested_stages_are_exclusive(fake_time):
    clock = StageClock()
    with clock("feedback"):          # 0 .. 10
        fake_time[0] += 1.0
        with clock("generation"):    # 1 .. 7
            fake_time[0] += 2.0
            with clock("sandbox"):   # 3 .. 6
                fake_time[0] += 3.0
            fake_time[0] += 1.0
        with clock("sandbox"):       # 7 .. 9
            fake_time[0] += 2.0
        fake_time[0] += 1.0
    assert dict(clock.seconds) == {"sandbox": 5.0, "generation": 3.0, "feedback": 2.0}
    assert sum(clock.seconds.values()) == 10.0  # the stages add up to the wall time, nothing counted twice


def test_since_and_a_stage_that_raises(fake_time):
    clock = StageClock()
    with clock("generation"):
        fake_time[0] += 4.0
    before = dict(clock.seconds)
    with pytest.raises(RuntimeError), clock("generation"):
        fake_time[0] += 1.5
        raise RuntimeError("the stage's time is still counted")
    assert clock.since(before) == {"generation": 1.5}
    assert clock._nested == []


def test_timed_sandbox_calls_are_the_sandbox_stage(fake_time):
    class Box:
        def run(self, code):
            fake_time[0] += 0.25
            return code

    clock = StageClock()
    box = TimedSandbox(Box(), clock)
    with clock("generation"):
        fake_time[0] += 1.0
        assert box.run("x") == "x"
    assert dict(clock.seconds) == {"sandbox": 0.25, "generation": 1.0}
