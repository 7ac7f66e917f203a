"""The save cadence (``schedule.save_every``): a checkpoint and the run state that names it are written
at block ends, every ``save_every`` updates of a block (at a sampling phase's end) and at a clean stop; a run
killed between two saves resumes from the last one and replays the updates after it to the same records.jsonl
and metrics.jsonl (``timing/*`` and ``perf/*`` aside) as an uninterrupted run, at every cadence setting, with
and without ``schedule.checkpoint_every_block`` (which names block-end checkpoints ``iter<t>/<role>`` or keeps
them in the ``resume/<role>-a|b`` copies)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from unifiedplayers.loop import outer as loop_module
from unifiedplayers.schedule import save_due
from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.loop.outer import OuterLoop, StopRun
from unifiedplayers.rundir import PHASE
from unifiedplayers.schedule import blocks, phase_steps

pytestmark = pytest.mark.cpu

# Blocks of 5 Planning, 2 Execution and 1 Evaluation updates (S = 1): blocks end after updates 5, 7 and 8.
BASE = ["experiment=tiny", "schedule.planning_updates=5", "schedule.execution_updates=2"]


class Crash(Exception):
    """A kill -9 after an update: nothing more is written (no save, no state)."""


def interrupt(kind: type[Exception], after: int):
    """Hook: raise ``kind`` once ``after`` updates of the run are complete."""

    def hook(event, loop, slot):
        if event == "update_end" and loop.state.completed == after:
            raise kind
    return hook


def run(run_dir: Path, overrides=(), hooks=(), resume=False) -> OuterLoop:
    loop = OuterLoop(compose(BASE + list(overrides) + (["resume=true"] if resume else [])), run_dir, hooks=hooks)
    loop.run()
    return loop


def lines(run_dir: Path) -> tuple[str, list[dict]]:
    metrics = [{k: v for k, v in m.items() if not k.startswith(("timing/", "perf/"))} for m in read_metrics(run_dir)]
    return (run_dir / "records.jsonl").read_text(), metrics


def saved_completed(run_dir: Path) -> int:
    """Updates completed at the last save (0: no state yet)."""
    path = run_dir / "state.pt"
    return torch.load(path, weights_only=False)["completed"] if path.exists() else 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, at the default cadence (its records do not depend on it)."""
    d = tmp_path_factory.mktemp("reference")
    run(d)
    return d, lines(d)


# ---------------------------------------------------------------- when a save is due


def test_saves_fall_at_block_ends_and_every_n_updates_at_phase_ends():
    def saves(overrides):  # the run's updates (1-based) after which a save falls
        cfg = compose(overrides)
        per_phase, out, start = phase_steps(cfg), [], 0
        for _ in range(cfg.schedule.outer_iterations):
            for role, size in blocks(cfg):
                out += [start + d for d in range(per_phase, size + 1, per_phase)
                        if save_due(d, size, per_phase, cfg.schedule.save_every)]
                start += size
        return out

    assert saves(BASE + ["schedule.save_every=1"]) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert saves(BASE + ["schedule.save_every=2"]) == [2, 4, 5, 7, 8]
    assert saves(BASE + ["schedule.save_every=0"]) == [5, 7, 8]
    s2 = ["experiment=tiny", "schedule.planning_updates=6", "schedule.execution_updates=2",
          "schedule.evaluation_updates=2", "schedule.steps_per_generation=2"]
    assert saves(s2 + ["schedule.save_every=1"]) == [2, 4, 6, 8, 10]  # phase ends only
    assert saves(s2 + ["schedule.save_every=3"]) == [4, 6, 8, 10]  # 3 falls inside the phase 3-4: its end
    # The paper presets (S = 4; blocks of 200, 300, 200): 14 saves an iteration, not 700 (~64 GB each).
    paper = compose(["experiment=paper_qwen3_4b"])
    planned = saves(["experiment=paper_qwen3_4b"])
    assert paper.schedule.save_every == 50 and len(planned) == 3 * 14
    assert planned[:5] == [52, 100, 152, 200, 252]
    assert saves(["experiment=paper_mimo_7b"]) == planned
    assert saves(["experiment=smoke"]) == [2, 4, 6]  # each block is one phase: its end


def test_a_block_end_always_saves_and_the_cadence_counts_the_blocks_updates():
    assert save_due(4, 4, 2, 0) and not save_due(2, 4, 2, 0)  # block ends only
    assert save_due(2, 6, 2, 2) and save_due(4, 6, 2, 3) and not save_due(2, 6, 2, 3)  # 3 falls in the phase 3-4


# ---------------------------------------------------------------- stop and resume at every cadence


CADENCES = {  # save_every -> the state's completed updates after a crash after 3, a stop after 4, a crash after 6
    1: (3, 4, 6),
    2: (2, 4, 5),  # the crash after 3 replays update 3; the one after 6 replays 6
    0: (0, 4, 5),  # block ends only: the first crash restarts the run from its first update
}


@pytest.mark.parametrize("every_block", [True, False])
@pytest.mark.parametrize("save_every", sorted(CADENCES))
def test_stop_and_resume_at_every_cadence_equals_an_uninterrupted_run(reference, tmp_path, save_every, every_block):
    """Killed after update 3 (inside the Planning block), stopped cleanly after 4 (a stop saves), killed after 6
    (inside the Execution block: the resumed run reads the Planning player's block-end checkpoint, which
    ``checkpoint_every_block=false`` keeps in a resume copy), then resumed to the end."""
    over = [f"schedule.save_every={save_every}", f"schedule.checkpoint_every_block={str(every_block).lower()}"]
    d = tmp_path / "run"
    for (kind, after), want in zip([(Crash, 3), (StopRun, 4), (Crash, 6)], CADENCES[save_every]):
        hook = interrupt(kind, after)
        if kind is Crash:
            with pytest.raises(Crash):
                run(d, over, [hook], resume=d.exists())
        else:
            run(d, over, [hook], resume=True)
        assert saved_completed(d) == want, (kind.__name__, after)
    state = torch.load(d / "state.pt", weights_only=False)
    block_end = "checkpoints/iter1/planning" if every_block else "checkpoints/resume/planning-"
    assert state["checkpoints"]["planning"].startswith(block_end)
    assert run(d, over, resume=True).finished
    assert lines(d) == reference[1]


def test_a_clean_stop_inside_a_phase_resumes_on_its_units_and_saves_at_its_end(tmp_path):
    """S = 2, block ends only. Stopped after update 1 (inside phase 0: the state names it, phase.pt holds it);
    the resumed run trains on phase.pt's minibatches and saves at the phase's end, so that phase 2's phase.pt, written
    when it is sampled, never replaces the one a state names; killed after update 3 (inside phase 2), the run
    resumes from that save and samples phase 2 again."""
    s2 = ["schedule.planning_updates=4", "schedule.steps_per_generation=2", "schedule.execution_updates=2",
          "schedule.evaluation_updates=2", "schedule.save_every=0"]
    ref = tmp_path / "ref"
    run(ref, s2)
    d = tmp_path / "run"
    run(d, s2, [interrupt(StopRun, 1)])
    state = torch.load(d / "state.pt", weights_only=False)
    assert (state["completed"], state["phase"]) == (1, 0)
    assert torch.load(d / PHASE, weights_only=False)["first"] == 0
    sampled: list[int] = []
    real = OuterLoop._sample_phase

    def spy(self, slot):
        sampled.append(slot.index)
        return real(self, slot)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OuterLoop, "_sample_phase", spy)
        with pytest.raises(Crash):
            run(d, s2, [interrupt(Crash, 3)], resume=True)
        assert sampled == [2] and saved_completed(d) == 2  # phase 0 went on from phase.pt, saved at its end
        assert run(d, s2, resume=True).finished
    assert sampled == [2, 2, 4, 6]  # phase 2 sampled again after the crash
    assert lines(d) == lines(ref)


def test_a_run_saves_on_its_cadence_only(tmp_path, monkeypatch):
    """save_every = 2: the checkpoints written are those of updates 2, 4 and the three block ends, one each."""
    written: list[int] = []
    real = loop_module.save_active

    def count(team, role, *args):
        written.append(len(read_metrics(tmp_path)))  # the updates logged when the checkpoint is written
        return real(team, role, *args)

    monkeypatch.setattr(loop_module, "save_active", count)
    run(tmp_path, ["schedule.save_every=2"])
    assert written == [2, 4, 5, 7, 8]
