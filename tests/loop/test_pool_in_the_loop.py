"""The fixed diagnostic pool inside the outer loop (§4.4, Appendix D.2) on the tiny random model: entries at the right
Execution updates, in metrics.jsonl, execution_pool.jsonl and the summary; no effect on training; resume
neither repeats nor loses an evaluation; the pool is answered and graded end to end (scripted engine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.players.scripted import ScriptedEngine

import unifiedplayers.diagnostics.execution_pool as execution_pool
from unifiedplayers.config import compose
from unifiedplayers.diagnostics.execution_pool import build_pool, evaluate_pool, negative_steps
from unifiedplayers.rundir import EXECUTION_POOL
from unifiedplayers.diagnostics.logging import read_metrics
import unifiedplayers.loop.outer as loop_module
import unifiedplayers.loop.team as team_module
from unifiedplayers.loop.outer import OuterLoop

pytestmark = pytest.mark.cpu

# Two outer iterations of 3 Execution updates (no Planning or Evaluation block): Execution updates
# e = 1..6 in slots 0..5; with every = 2 the pool is evaluated on the initial checkpoint (e = 0, Appendix
# D.2: update zero is evaluated, before slot 0) and after e = 2, 4, 6 (slots 1, 3, 5).
BASE = ["experiment=tiny", "schedule.outer_iterations=2", "schedule.planning_updates=0",
        "schedule.evaluation_updates=0", "schedule.execution_updates=3"]
POOL_ON = ["schedule.execution_pool.every=2"]


def run(d: Path, overrides=(), **kw):
    loop = OuterLoop(compose(BASE + list(overrides)), d, **kw)
    loop.run()
    return loop


def without_timing(d: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in read_metrics(d)]


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pool")
    return d, run(d, POOL_ON)


def test_pool_entries_at_every_second_execution_update(pool_run):
    d, loop = pool_run
    metrics = read_metrics(d)
    assert [m["block"] for m in metrics] == ["execution"] * 6
    with_pool = [(m["global_update"], m["execution/pool_step"]) for m in metrics if "execution/pool_step" in m]
    assert with_pool == [(1, 2), (3, 4), (5, 6)]
    assert metrics[0]["execution/pool0_step"] == 0 and "execution/pool0_step" not in metrics[1]
    for m in metrics:
        if "execution/pool_step" in m:
            assert m["execution/pool_size"] == 4
            for key in ("execution/pool_accuracy", "execution/pool_accuracy_math", "execution/pool_accuracy_general"):
                assert 0.0 <= m[key] <= 1.0
    entries = [json.loads(x) for x in (d / EXECUTION_POOL).read_text().splitlines()]
    assert [(e["execution_step"], e["global_update"], e["outer_iteration"]) for e in entries] == [(0, -1, 1), (2, 1, 1), (4, 3, 2), (6, 5, 2)]
    for e in entries:
        assert e["num_math"] == 2 and e["num_general"] == 2 and len(e["items"]) == 4 and e["missing"] == []
        assert e["checkpoint"]["player"] == "execution" and e["checkpoint"]["step"] == e["execution_step"]
    summary = json.loads((d / "summary.json").read_text())["execution_pool"]
    assert summary["steps"] == [0, 2, 4, 6]
    acc = [metrics[0]["execution/pool0_accuracy"]] + [m["execution/pool_accuracy"] for m in metrics
                                                       if "execution/pool_step" in m]
    assert summary["accuracy"] == acc
    assert (summary["negative_step_rate"], summary["max_drop"]) == negative_steps(acc)
    assert "negative-step rate" in (d / "summary.md").read_text()


def test_the_pool_does_not_change_training(pool_run, tmp_path):
    d, loop = pool_run
    off = run(tmp_path)
    assert not (tmp_path / EXECUTION_POOL).exists()
    assert (d / "records.jsonl").read_text() == (tmp_path / "records.jsonl").read_text()
    pool_keys = ("execution/pool_", "execution/pool0_")
    assert [{k: v for k, v in m.items() if not k.startswith(pool_keys)} for m in without_timing(d)] == without_timing(tmp_path)
    a, b = loop.players["execution"].model.state_dict(), off.players["execution"].model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_neither_repeats_nor_loses_an_evaluation(pool_run, tmp_path, monkeypatch):
    reference, _ = pool_run
    calls = []
    real = execution_pool.evaluate_pool  # as the team answers the pool
    monkeypatch.setattr(team_module, "evaluate_pool", lambda *a, **k: calls.append(1) or real(*a, **k))

    # Killed during slot 3 after its pool evaluation and its metrics line, before its checkpoint and state
    # (saved after every update, so that slot 3 has a save to die in).
    every = POOL_ON + ["schedule.save_every=1"]

    def save_then_die(team, role, *args):
        if len(read_metrics(tmp_path)) == 4:  # slot 3's save
            raise KeyboardInterrupt("killed")
        return real_save(team, role, *args)

    real_save = loop_module.save_active
    monkeypatch.setattr(loop_module, "save_active", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, every)
    assert len(calls) == 3  # e = 0, 2 and 4
    assert len(read_metrics(tmp_path)) == 4  # slot 3's line was written, its state was not
    monkeypatch.setattr(loop_module, "save_active", real_save)
    run(tmp_path, every + ["resume=true"])
    assert len(calls) == 4  # slot 3 was redone with its logged evaluation; only e = 6 was decoded
    assert without_timing(tmp_path) == without_timing(reference)
    steps = [json.loads(x)["execution_step"] for x in (tmp_path / EXECUTION_POOL).read_text().splitlines()]
    assert steps == [0, 2, 4, 6]


def test_a_replay_after_the_last_save_reuses_the_logged_evaluation(pool_run, tmp_path, monkeypatch):
    """Block ends only (the default cadence saves no update of a 3-update block): killed after slot 4, the run
    resumes from slot 2's save and replays slots 3 and 4; slot 3's evaluation (e = 4) is read back, not
    decoded again, and execution_pool.jsonl holds each evaluation once."""
    reference, _ = pool_run
    calls = []
    real = execution_pool.evaluate_pool  # as the team answers the pool
    monkeypatch.setattr(team_module, "evaluate_pool", lambda *a, **k: calls.append(1) or real(*a, **k))

    def die(event, loop, slot):
        if event == "update_end" and slot.index == 4:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, POOL_ON + ["schedule.save_every=0"], hooks=[die])
    assert len(calls) == 3 and torch.load(tmp_path / "state.pt", weights_only=False)["completed"] == 3
    run(tmp_path, POOL_ON + ["schedule.save_every=0", "resume=true"])
    assert len(calls) == 4  # e = 6 only
    assert without_timing(tmp_path) == without_timing(reference)
    steps = [json.loads(x)["execution_step"] for x in (tmp_path / EXECUTION_POOL).read_text().splitlines()]
    assert steps == [0, 2, 4, 6]


def test_a_missing_pool_file_does_not_stop_the_run(tmp_path):
    with pytest.warns(RuntimeWarning, match="no math questions"):
        run(tmp_path, ["schedule.execution_pool.every=3", f"schedule.execution_pool.math_path={tmp_path}/gone.jsonl"])
    metrics = read_metrics(tmp_path)
    assert [m["execution/pool_size"] for m in metrics if "execution/pool_step" in m] == [2, 2]  # general only
    assert metrics[0]["execution/pool0_size"] == 2
    assert all(m["execution/pool_accuracy_math"] is None for m in metrics if "execution/pool_step" in m)
    summary = json.loads((tmp_path / "summary.json").read_text())["execution_pool"]
    assert summary["steps"] == [0, 3, 6] and "gone.jsonl" in summary["missing"][0]
    assert "[missing]" in (tmp_path / "summary.md").read_text()


def test_the_pool_is_answered_greedily_and_graded_end_to_end():
    from unifiedplayers.models import load_model

    cfg = compose(["experiment=tiny", "schedule.execution_pool.math_size=2", "schedule.execution_pool.general_size=2",
                   "schedule.execution_pool.max_new_tokens=64"])  # the byte tokenizer: one token per character
    _, tok = load_model(cfg.model)
    questions, _ = build_pool(cfg.schedule.execution_pool)
    right = {questions[0].problem.question: f"\\boxed{{{questions[0].problem.reference}}}",
             questions[2].problem.question: f"The answer is \\boxed{{{questions[2].problem.reference}}}"}
    seen = []

    def respond(context, j):
        seen.append(context)
        return next((a for q, a in right.items() if q in context), "\\boxed{Z}")

    engine = ScriptedEngine(tok, respond)
    result = evaluate_pool(engine, None, tok, cfg.player, cfg.schedule.execution_pool, questions)
    assert [i["correct"] for i in result["items"]] == [True, False, True, False]
    assert result["accuracy"] == 0.5 and result["accuracy_math"] == 0.5 and result["accuracy_general"] == 0.5
    assert len(seen) == 4 and all(cfg.player.execution.system in c for c in seen)  # the player's own prompt
    assert "Choose the correct option (A, B, C, D)" in seen[2]
