"""The paper presets rehearsed on CPU: the trainer and schedule settings of
``experiment=paper_qwen3_4b`` and ``paper_mimo_7b`` on the tiny random model for one outer iteration of the three
players (overrides: tests/distributed/paper_rehearsal.py, derived from the presets key by key).

- coverage: every key of both presets is rehearsed at the preset's value or listed as GPU-only or scale-only,
  with its reason;
- one process: ``python -m unifiedplayers.train`` with ZeRO-3, ZeRO-Offload (DeepSpeed's CPU Adam), ref_mode
  precompute, gradient checkpointing, π_old recomputed, S = 4 and a cadence save inside the Planning block, killed
  with SIGKILL after its first save and resumed, to the records and metrics of an uninterrupted run;
- two ranks under torchrun (gloo): tests/distributed/test_data_parallel_deepspeed.py, whose launch runs the same
  overrides as one of its jobs (``test_the_paper_rehearsal_over_two_ranks``).

The runs' wall time on the development machine (2 cores): see ``test_the_paper_path_killed_and_resumed``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tests import determinism  # noqa: E402
from tests.distributed.launch import SRC  # noqa: E402
from tests.distributed.paper_rehearsal import (  # noqa: E402
    GPU_ONLY,
    NOT_REHEARSED,
    PRESETS,
    SCALE_ONLY,
    TINY,
    flat,
    rehearsal_overrides,
    unrehearsed,
)

from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.diagnostics.logging import read_metrics  # noqa: E402

pytestmark = [pytest.mark.cpu]

UPDATES = 16  # 8 Planning, 4 Execution, 4 Evaluation (SCALE_ONLY)


# ---------------------------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("preset", PRESETS)
def test_every_key_of_a_paper_preset_is_rehearsed_or_listed(preset):
    assert unrehearsed(preset, rehearsal_overrides(preset)) == {}
    keys = flat(compose([f"experiment={preset}"]))
    assert not set(NOT_REHEARSED) - set(keys), "a listed key the presets do not have"
    assert not set(GPU_ONLY) & set(SCALE_ONLY)
    for key, (_, why) in NOT_REHEARSED.items():
        assert why and "\n" not in why, key


def test_one_rehearsal_serves_both_presets_and_runs_what_it_must():
    overrides = rehearsal_overrides(PRESETS[0])
    assert rehearsal_overrides(PRESETS[1]) == overrides  # they differ in model keys only, all listed
    cfg = compose(overrides)
    t, s = cfg.trainer, cfg.schedule
    assert (t.backend, t.ref_mode) == ("deepspeed_zero3", "precompute")
    assert t.offload_optimizer and t.gradient_checkpointing and t.recompute_old_logprobs
    assert s.steps_per_generation == 4 and s.outer_iterations == 1
    assert s.planning_updates + s.execution_updates + s.evaluation_updates == UPDATES
    # A cadence save inside the Planning block, at the end of its first phase (where the run below is killed).
    assert s.save_every == s.steps_per_generation < s.planning_updates
    assert s.execution_pool.every == s.execution_updates  # the Appendix D.2 pool, once
    assert cfg.experiment == "tiny" and cfg.model.device == "cpu" and cfg.trainer.dtype == "float32"


def test_an_unlisted_key_that_the_rehearsal_leaves_out_fails_the_coverage():
    overrides = rehearsal_overrides(PRESETS[0])
    assert unrehearsed(PRESETS[0], [*overrides, "trainer.gradient_checkpointing=false"]) == {
        "trainer.gradient_checkpointing": (True, False)}
    assert unrehearsed(PRESETS[0], [o for o in overrides if not o.startswith("schedule.steps_per_generation")]) == {
        "schedule.steps_per_generation": (4, 1)}
    assert TINY not in str(overrides)


# ---------------------------------------------------------------------------------------------- one process
def train(run_dir: Path, *extra: str) -> subprocess.Popen:
    """``python -m unifiedplayers.train`` of the rehearsal in ``run_dir``, one torch thread, its output in a log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # a process of its own
        env.pop(key, None)
    cmd = [sys.executable, "-m", "unifiedplayers.train", *rehearsal_overrides(), f"run_dir={run_dir}", *extra]
    with open(run_dir.with_suffix(".log"), "a") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> None:
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, run_dir.with_suffix(".log").read_text()[-6000:]


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def pool(run_dir: Path) -> list[dict]:
    """The Appendix D.2 pool's evaluations, but for their wall time."""
    rows = (json.loads(line) for line in (run_dir / "execution_pool.jsonl").read_text().splitlines())
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def kill_after_first_save(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> tuple[int, int]:
    """Polls until the first save's state.pt is on disk and an update after it has written its metrics line, then
    SIGKILLs the run; returns (updates completed at the last save, metrics lines on disk at the kill)."""
    first_save = compose(rehearsal_overrides()).schedule.save_every  # at update 4, the first phase's end
    state, metrics, deadline = run_dir / "state.pt", run_dir / "metrics.jsonl", time.monotonic() + timeout
    while not (state.exists() and lines(metrics) > first_save):
        assert proc.poll() is None, "the run ended first: " + run_dir.with_suffix(".log").read_text()[-4000:]
        assert time.monotonic() < deadline, "no save"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return torch.load(state, weights_only=False)["completed"], lines(metrics)


@pytest.mark.slow
def test_the_paper_path_killed_and_resumed(tmp_path):
    """The uninterrupted run and the one killed after its first save (then resumed) run side by side (one torch
    thread each): 32-43 s in all on the development machine's 2 cores (load 0.5-2), 18-20 s for a run alone. The
    kill lands after the save at update 4 (the end of the first Planning phase) and, mostly, after update 5's
    lines, which the resumed run cuts and replays."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    reference = train(whole)
    try:
        saved, written = kill_after_first_save(train(killed), killed)
        assert 4 <= saved < UPDATES and written >= saved, (saved, written)
        finish(train(killed, "resume=true"), killed)
    finally:
        finish(reference, whole)

    assert determinism.first_difference(whole, killed) is None
    assert pool(killed) == pool(whole) and [p["execution_step"] for p in pool(whole)] == [0, 4]
    metrics = read_metrics(whole)
    assert [(m["block"], m["update"]) for m in metrics] == [
        *(("planning", u) for u in range(8)), *(("execution", u) for u in range(4)),
        *(("evaluation", u) for u in range(4))]
    assert all(m[f"{m['block']}/skipped"] == 0.0 for m in metrics)
    assert all(0.0 <= m[f"{m['block']}/logprob_mismatch"] < 1e-4 for m in metrics)  # π_old recomputed every step
    assert any(m["planning/grad_norm"] > 0 for m in metrics[:8])  # the players moved: the resume had state to keep
    assert metrics[11]["execution/pool_step"] == 4
    cfg = OmegaConf.load(killed / "config.yaml")
    assert len(cfg.machine) == 2  # two starts: the killed one and the resume
    for role in ("planning", "execution", "evaluation"):  # ZeRO-3 state of DeepSpeed's CPU Adam, one partition
        state = killed / "checkpoints" / "iter1" / role / "deepspeed" / "state"
        assert [p.name for p in state.glob("*optim_states.pt")] == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert not list(killed.glob("**/.*.tmp-*"))
