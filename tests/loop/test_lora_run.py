"""Runs of the outer loop with adapter players (``trainer.lora.rank`` > 0) on the tiny model: the three players train
on one frozen backbone held once, the run directory holds adapters only (checkpoints, π_ref, stale feedback's
published copies), a resume after ``kill -9`` inside a phase equals the uninterrupted run, and Absolute Zero's shared
model is one adapter for its two roles."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.loop import toy_reward
from tests.loop.test_phases import S4, no_timing
from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.rundir import PUBLISHED
from unifiedplayers import lora

pytestmark = pytest.mark.cpu

LORA = S4 + ["trainer.lora.rank=4", "trainer.lr=1e-1"]
ROLES = ("planning", "execution", "evaluation")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as mp:
        toy_reward.install(mp)
        loop = OuterLoop(compose(LORA), d)
        loop.run()
    return d, loop


def test_the_three_players_train_their_adapters_on_one_backbone(lora_run):
    d, loop = lora_run
    models = [loop.players[r].model for r in ROLES]
    frozen = [{id(p) for p in m.parameters() if not p.requires_grad} for m in models]
    assert frozen[0] == frozen[1] == frozen[2] and frozen[0]  # the same tensors: one backbone in memory
    for role, model in zip(ROLES, models):
        trained = [m for m in read_metrics(d) if m["block"] == role and not m[f"{role}/skipped"]]
        assert trained and max(m[f"{role}/grad_norm"] for m in trained) > 0, role
        b = [t for n, t in lora.adapter_state(model).items() if "lora_B" in n]
        assert any(t.abs().sum() > 0 for t in b), role  # B left zero: the adapter moved


def test_the_run_directory_holds_adapters_and_no_backbone(lora_run):
    d, loop = lora_run
    adapter_keys = set(lora.adapter_state(loop.players["planning"].model))
    weights = sorted(d.rglob("*.pt"))
    assert weights
    for path in weights:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
            assert set(state) == adapter_keys, path  # model.pt, reference.pt: an adapter's tensors alone


def test_resume_after_kill_9_inside_a_phase_equals_an_uninterrupted_run(lora_run, tmp_path, monkeypatch):
    """Killed in the Execution phase's third update: the resumed run samples the phase again from the Planning
    block's save and equals the uninterrupted run, records, metrics and adapters."""
    reference, ref_loop = lora_run
    script = textwrap.dedent(f"""
        import os, signal
        import pytest
        from tests.loop import toy_reward
        toy_reward.install(pytest.MonkeyPatch())
        from unifiedplayers.config import compose
        from unifiedplayers.loop.outer import OuterLoop
        from unifiedplayers.trainer.torch_backend import TorchTrainer
        real, n = TorchTrainer.update, [0]
        def update(self, batch, **kwargs):
            n[0] += 1
            if n[0] == 7:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, batch, **kwargs)
        TorchTrainer.update = update
        OuterLoop(compose({LORA!r}), {str(tmp_path)!r}).run()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).parents[2])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    toy_reward.install(monkeypatch)
    loop = OuterLoop(compose(LORA + ["resume=true"]), tmp_path)
    loop.run()
    assert (tmp_path / "records.jsonl").read_text() == (reference / "records.jsonl").read_text()
    assert no_timing(tmp_path) == no_timing(reference)
    for role in ROLES:
        a, b = lora.adapter_state(loop.players[role].model), lora.adapter_state(ref_loop.players[role].model)
        assert all(torch.equal(a[k], b[k]) for k in a), role


def test_stale_feedback_publishes_adapters_over_the_shared_backbone(tmp_path, monkeypatch):
    """Stale feedback's published copy is each player's adapter at the start of the outer iteration (§7): in
    iteration 2 the adapter iteration 1 ended with, not iteration 1's start nor the latest, and a resume inside
    iteration 2 reads it back from its file."""
    toy_reward.install(monkeypatch)
    cfg = ["experiment=tiny", "trainer.lora.rank=4", "schedule.feedback=stale", "schedule.outer_iterations=2",
           "trainer.lr=1e-1"]
    at_start: dict[str, dict[str, torch.Tensor]] = {}  # the adapters when iteration 1's last block ends

    def snapshot(event, loop, slot):
        if event == "block_end" and slot.iteration == 1:
            at_start.update({r: {k: v.clone() for k, v in lora.adapter_state(p.model).items()}
                             for r, p in loop.players.items()})

    loop = OuterLoop(compose(cfg), tmp_path, hooks=[snapshot])
    loop.run()

    def published_is_the_start(role):
        got = lora.adapter_state(loop.players[role].published_model)
        return set(got) == set(at_start[role]) and all(torch.equal(got[k], at_start[role][k]) for k in got)

    moved = [r for r in ROLES if any(not torch.equal(v, at_start[r][k])
                                     for k, v in lora.adapter_state(loop.players[r].model).items())]
    assert moved  # iteration 2 moved some player past its published copy
    assert all(published_is_the_start(r) for r in ROLES)
    team = loop.team
    team.resume_iteration(2, tmp_path, {r: p.published_version for r, p in team.players.items()}, loop.state.published)
    assert all(published_is_the_start(r) for r in ROLES)  # read back from published/<role>.pt
    backbone = {id(p) for p in loop.players["planning"].model.parameters() if not p.requires_grad}
    for role in ROLES:
        published = loop.players[role].published_model
        assert published is not None and published is not loop.players[role].model
        assert {id(p) for p in published.parameters() if not p.requires_grad} - {
            id(p) for p in lora.adapter_parameters(published)} <= backbone
        saved = torch.load(tmp_path / PUBLISHED / f"{role}.pt", weights_only=True)
        assert set(saved) == set(lora.adapter_state(published))


def test_absolute_zeros_shared_model_is_one_adapter(tmp_path, monkeypatch):
    toy_reward.install(monkeypatch)
    loop = OuterLoop(compose(["experiment=tiny", "method=absolute_zero", "trainer.lora.rank=4"]), tmp_path)
    loop.run()
    assert loop.players["planning"].model is loop.players["execution"].model
    assert lora.is_adapted(loop.players["planning"].model)
    assert len(read_metrics(tmp_path)) > 0


@pytest.mark.parametrize("method", ["vanilla", "tool_augmented", "r_zero", "agent0"])  # socratic_zero: test_socratic_loop.py
def test_every_baseline_trains_adapter_players(tmp_path, monkeypatch, method):
    """Each baseline's own loop with adapter players on the tiny model: it runs to its end, and every player it
    trains is an adapter on the one backbone."""
    toy_reward.install(monkeypatch)
    loop = OuterLoop(compose(["experiment=tiny", f"method={method}", "trainer.lora.rank=4"]), tmp_path)
    loop.run()
    assert loop.finished
    backbone = {id(p) for p in loop.players["planning"].model.parameters() if not p.requires_grad}
    for role, player in loop.players.items():
        assert lora.is_adapted(player.model), role
        assert {id(p) for p in player.model.parameters() if not p.requires_grad} == backbone, role
