"""Sampling phases (§3.3, Appendix B.3): one sampling phase feeds S × μ optimizer steps on fixed
records, so π_θ moves off π_old inside a phase and the clip of Eq. 19 can bind. Per-role hyperparameters
(Table 6). R(q)'s question history held fixed within a block. Exact resume after a kill -9 inside a phase."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.loop import toy_reward
import torch

from unifiedplayers.config import compose, resolve_player_config, role_temperature, role_trainer_config
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.loop.phase import split_minibatches, minibatch_of_step
from unifiedplayers.loop.engines import SamplingTemperature
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.schedule import position

pytestmark = pytest.mark.cpu

# One outer iteration, each block one phase of four optimizer steps (S = 4): Planning samples 4 questioner
# prompts at once, Execution and Evaluation 4 tasks; each step trains on one of the four disjoint minibatches.
S4 = ["experiment=tiny", "schedule.planning_updates=4", "schedule.execution_updates=4",
      "schedule.evaluation_updates=4", "schedule.steps_per_generation=4", "trainer.lr=3e-2", "trainer.kl_coef=0.0"]


def no_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in read_metrics(run_dir)]


# ---------------------------------------------------------------- the plan


def test_plan_cuts_blocks_into_phases_of_s_times_mu_steps():
    cfg = compose(["experiment=tiny", "schedule.planning_updates=4", "schedule.execution_updates=8",
                   "schedule.evaluation_updates=4", "schedule.steps_per_generation=2", "trainer.num_iterations=2"])
    assert [position(cfg, n) for n in range(12)] == [  # (iteration, block, phase, step) of each update
        (1, 0, 0, 0), (1, 0, 0, 1), (1, 0, 0, 2), (1, 0, 0, 3), (1, 1, 0, 0), (1, 1, 0, 1), (1, 1, 0, 2), (1, 1, 0, 3),
        (1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 1, 3)]
    # μ passes over the S minibatches in order: steps 0..3 train minibatches 0, 1, 0, 1 (passes 0, 0, 1, 1)
    assert [minibatch_of_step(j, 2) for j in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # S = μ = 1 (the default): every update is its own phase
    tiny = compose(["experiment=tiny"])
    assert all(position(tiny, n)[3] == 0 for n in range(3))


def test_units_are_disjoint_and_cover_the_phase():
    assert split_minibatches(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert split_minibatches(5, 4) == [[0, 1], [2], [3], [4]]  # a shortfall is spread, not left to the last minibatches
    assert split_minibatches(2, 4) == [[0], [1], [], []]


def test_a_block_that_is_not_a_multiple_of_the_phase_fails_at_start_up(tmp_path):
    with pytest.raises(ValueError, match="not a multiple of schedule.steps_per_generation"):
        OuterLoop(compose(["experiment=tiny", "schedule.steps_per_generation=2"]), tmp_path)
    with pytest.raises(ValueError, match="need >= 1"):
        OuterLoop(compose(["experiment=tiny", "trainer.num_iterations=0"]), tmp_path)


# ---------------------------------------------------------------- a run with S = 4


@pytest.fixture(scope="module")
def s4_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("s4")
    with pytest.MonkeyPatch.context() as mp:
        toy_reward.install(mp)
        loop = OuterLoop(compose(S4), d)
        calls = {"planning": 0, "execution": 0, "evaluation": 0}
        real = loop.team.engine

        def counting(role, active):  # every generation stage asks for its player's engine once
            calls[role] += 1
            return real(role, active)

        loop.team.engine = counting
        loop.run()
    return d, loop, calls


def test_one_generation_per_four_updates_and_the_ratio_moves_off_one(s4_run):
    d, loop, calls = s4_run
    metrics = read_metrics(d)
    assert len(metrics) == 12
    # Three phases (one per block), each sampling every player once: 12 updates, 3 generations per player.
    assert calls == {"planning": 3, "execution": 3, "evaluation": 3}
    for m in metrics:
        assert (m["timing/generation_s"] > 0) == (m["phase_step"] == 0)
    assert [m["phase"] for m in metrics] == [0] * 4 + [4] * 4 + [8] * 4
    assert [m["phase_minibatch"] for m in metrics] == [0, 1, 2, 3] * 3
    # The first step of a phase trains with π_θ = π_old (ϱ = 1); later steps on the same records do not.
    trained = [m for m in metrics if not m[f"{m['block']}/skipped"]]
    firsts = [m for m in trained if m["phase_step"] == 0]
    laters = [m for m in trained if m["phase_step"] > 0]
    assert firsts and laters
    for m in firsts:
        assert m[f"{m['block']}/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    moved = [max(abs(m[f"{m['block']}/ratio_max"] - 1), abs(m[f"{m['block']}/ratio_min"] - 1)) for m in laters]
    assert max(moved) > 0.2, moved  # beyond ε_clip = 0.2: the clip interval is left
    assert max(m[f"{m['block']}/clip_frac"] for m in laters) > 0.0
    # One record per Planning output of the phase, naming its phase and the update that trains on it.
    recs = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
    planning = [r for r in recs if r["meta"]["block"] == "planning"]
    assert len(planning) == 4 * 2  # 4 prompts × G_T = 2
    assert {r["meta"]["phase"] for r in recs} == {0, 4, 8}
    played = [r for r in recs if r["meta"]["block"] == "execution" and r["meta"]["status"] == "played"]
    assert [r["meta"]["global_update"] for r in played] == [4, 5, 6, 7]  # one task per minibatch, in order


def test_mu_two_passes_over_the_units(tmp_path, monkeypatch):
    toy_reward.install(monkeypatch)
    cfg = ["experiment=tiny", "schedule.planning_updates=0", "schedule.evaluation_updates=0",
           "schedule.execution_updates=4", "schedule.steps_per_generation=2", "trainer.num_iterations=2",
           "trainer.lr=3e-2", "trainer.kl_coef=0.0"]
    OuterLoop(compose(cfg), tmp_path).run()
    metrics = read_metrics(tmp_path)
    assert [(m["phase_pass"], m["phase_minibatch"]) for m in metrics] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [m["timing/generation_s"] > 0 for m in metrics] == [True, False, False, False]
    # A minibatch's sampling figures are on its first pass's line only; the second pass trains a moved policy.
    assert "execution/reward_mean" in metrics[0] and "execution/reward_mean" not in metrics[2]
    trained = [m for m in metrics[1:] if not m["execution/skipped"]]
    assert trained and all(abs(m["execution/ratio_max"] - 1) > 1e-4 or abs(m["execution/ratio_min"] - 1) > 1e-4
                           for m in trained)
    assert max(m["execution/clip_frac"] for m in trained) > 0.0  # the clip binds in the second pass or before


def test_question_history_is_held_fixed_within_a_block(tmp_path):
    seen = []

    def hook(event, loop, slot):
        if event == "update_end":
            seen.append((slot.role, slot.step_in_block, len(loop.history), len(loop.state.block_questions)))

    cfg = compose(["experiment=tiny", "schedule.planning_updates=2", "schedule.execution_updates=2",
                   "schedule.evaluation_updates=0"])
    OuterLoop(cfg, tmp_path, hooks=[hook]).run()
    # Planning block: 2 updates × G_T = 2 tasks; R(q) compares against the (empty) block-start history
    # throughout, and the block's 4 questions join the history at the next block's start.
    # Execution block: one task per update, compared against those 4.
    assert seen == [("planning", 0, 0, 2), ("planning", 1, 0, 4), ("execution", 0, 4, 1), ("execution", 1, 4, 2)]
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    second = [r for r in recs if r["meta"]["block"] == "planning" and r["meta"]["update"] == 1
              and r["meta"]["status"] == "played"]
    # The tiny preset's Planning prefix gives every task the same question: a history updated after each
    # update would give the second update R = 1; held fixed (empty) within the block it is 0.
    assert second and all(r["rewards"]["R"] == 0.0 for r in second)
    executed = [r for r in recs if r["meta"]["block"] == "execution" and r["meta"]["status"] == "played"]
    assert executed and all(r["rewards"]["R"] == 1.0 for r in executed)  # the Planning block's questions


@pytest.mark.parametrize("killed_at", [5, 8])
def test_resume_after_kill_9_inside_a_phase_equals_an_uninterrupted_run(s4_run, tmp_path, killed_at, monkeypatch):
    """Killed in the Execution phase's first update (5: just after the phase was sampled) or its last (8): the
    last save is the Planning block's end (``schedule.save_every``: saves fall at phase ends), so the resumed run
    samples the Execution phase again, from the saved RNG states and seeds, and equals the uninterrupted one.
    (A clean stop inside a phase saves it and resumes on its minibatches: tests/loop/test_save_cadence.py.)"""
    reference = s4_run[0]
    script = textwrap.dedent(f"""
        import os, signal, sys
        import pytest
        from tests.loop import toy_reward
        toy_reward.install(pytest.MonkeyPatch())
        from unifiedplayers.config import compose
        from unifiedplayers.loop.outer import OuterLoop
        from unifiedplayers.trainer.torch_backend import TorchTrainer
        real, n = TorchTrainer.update, [0]
        def update(self, batch, **kwargs):
            n[0] += 1
            if n[0] == {killed_at}:  # an update of the Execution block's phase: killed mid-update
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, batch, **kwargs)
        TorchTrainer.update = update
        OuterLoop(compose({S4!r}), {str(tmp_path)!r}).run()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).parents[2])  # tests.* importable
    assert proc.returncode == -9, proc.stderr[-2000:]
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert state["completed"] == 4 and state["phase"] is None  # the Planning block's end
    toy_reward.install(monkeypatch)  # the reference run's rewards (its fixture undid them when it ended)
    loop = OuterLoop(compose(S4 + ["resume=true"]), tmp_path)
    sampled = []
    real_sample = loop._sample_phase
    loop._sample_phase = lambda slot: sampled.append(slot.index) or real_sample(slot)
    loop.run()
    assert sampled == [4, 8]  # the Execution phase replayed from its sampling, then the Evaluation phase
    assert (tmp_path / "records.jsonl").read_text() == (reference / "records.jsonl").read_text()
    assert no_timing(tmp_path) == no_timing(reference)
    ref_loop = s4_run[1]
    for role in ("planning", "execution", "evaluation"):
        a, b = loop.players[role].model.state_dict(), ref_loop.players[role].model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), role


# ---------------------------------------------------------------- per-role hyperparameters (Table 6)


def test_role_overrides_set_each_players_own_values(tmp_path):
    cfg = compose(["experiment=tiny", "trainer.roles.evaluation.lr=0.5", "trainer.roles.planning.clip_eps=0.3",
                   "trainer.roles.execution.kl_coef=0.0", "trainer.roles.execution.temperature=0.7",
                   "trainer.roles.evaluation.group_size=3", "trainer.roles.planning.group_size=5",
                   "trainer.roles.execution.group_size=6", "trainer.roles.execution.max_new_tokens=20"])
    assert role_trainer_config(cfg.trainer, "evaluation").lr == 0.5
    assert role_trainer_config(cfg.trainer, "execution").lr == cfg.trainer.lr  # unset: the shared value
    assert role_trainer_config(cfg.trainer, "planning").clip_eps == 0.3
    assert role_trainer_config(cfg.trainer, "execution").kl_coef == 0.0
    assert role_trainer_config(cfg.trainer, "execution").temperature == 0.7  # the log-probs match the sampling
    assert role_temperature(cfg, "execution") == 0.7 and role_temperature(cfg, "planning") == cfg.rollout.temperature
    p = resolve_player_config(cfg)
    assert (p.tasks_per_prompt, p.num_trajectories, p.num_verifiers, p.execution_max_new_tokens) == (5, 6, 3, 20)
    assert p.planning_max_new_tokens == cfg.player.planning_max_new_tokens
    loop = OuterLoop(cfg, tmp_path)
    loop.team.setup(*loop.team.load_backbone(None, loop.state.timing))
    assert loop.players["evaluation"].trainer.cfg.lr == 0.5
    assert loop.players["planning"].trainer.cfg.clip_eps == 0.3
    assert loop.players["execution"].trainer.cfg.lr == cfg.trainer.lr
    engine, _ = loop.team.engine("execution", "planning")
    assert isinstance(engine, SamplingTemperature) and engine.temperature == 0.7


def test_role_overrides_reject_an_unknown_role_or_key(tmp_path):
    with pytest.raises(Exception, match="critic"):  # the schema
        compose(["experiment=tiny", "trainer.roles.critic.lr=0.1"])
    with pytest.raises(Exception, match="momentum"):
        compose(["experiment=tiny", "trainer.roles.planning.momentum=0.1"])
    # Hydra's `+key=` appends past the schema: the loop refuses at start-up
    with pytest.raises(ValueError, match="trainer.roles.critic: unknown role"):
        OuterLoop(compose(["experiment=tiny", "+trainer.roles.critic.lr=0.1"]), tmp_path)
    with pytest.raises(ValueError, match="unknown key"):
        OuterLoop(compose(["experiment=tiny", "+trainer.roles.planning.momentum=0.1"]), tmp_path)


def test_a_role_temperature_reaches_the_engine_per_call():
    class Engine:
        def generate(self, prompts, **kw):
            return kw

        def continue_segments(self, ctx, **kw):
            return kw

    e = SamplingTemperature(Engine(), 0.6)
    assert e.generate(["x"], n=2)["temperature"] == 0.6
    assert e.generate(["x"], temperature=0.9)["temperature"] == 0.9  # an explicit value wins
    assert e.generate(["x"], greedy=True)["temperature"] is None  # greedy ignores it
    assert e.continue_segments([], n=1)["temperature"] == 0.6


# ---------------------------------------------------------------- entropy retention bank (§4.4, Appendix D.2)


def test_each_trainer_gets_the_shipped_held_out_bank_of_its_role(tmp_path):
    from unifiedplayers.diagnostics.entropy_bank import entropy_bank_texts
    from unifiedplayers.players.evaluation import evaluation_prompt

    loop = OuterLoop(compose(["experiment=tiny", "trainer.entropy_bank_size=3"]), tmp_path)
    loop.team.setup(*loop.team.load_backbone(None, loop.state.timing))
    bank = loop.players["evaluation"].trainer.entropy_bank
    assert len(bank) == 3
    first = evaluation_prompt(loop.team.tokenizer, loop.player_cfg, entropy_bank_texts("evaluation", 3)[0])
    assert bank[0].tolist() == loop.team.tokenizer(first, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="holds 256"):  # never a silent cap
        (big := OuterLoop(compose(["experiment=tiny", "trainer.entropy_bank_size=300"]), tmp_path / "big")).team.setup(*big.team.load_backbone(None, big.state.timing))


def test_accuracy_by_verifiers_is_a_strict_majority_of_each_tasks_valid_verifiers():
    """Worked by hand: task A's 2 valid verifiers accept its 3 trajectories 2, 1 and 0 times (a strict majority of 2
    is 2: 1, 0, 0); task B's 3 accept its 2 trajectories twice each (> 1.5: 1, 1); task C has no valid verifier and
    is left out. 3 of 5 trajectories: 0.6. With no task that has a valid verifier there is no figure."""
    import numpy as np
    from types import SimpleNamespace

    from unifiedplayers.loop.phase import accuracy_by_verifiers

    a = SimpleNamespace(z_orig=np.array([[1, 1, 0], [1, 0, 0]]))
    b = SimpleNamespace(z_orig=np.array([[1, 0], [1, 1], [0, 1]]))
    c = SimpleNamespace(z_orig=np.zeros((0, 2)))
    assert accuracy_by_verifiers([a, b, c]) == pytest.approx(0.6)
    assert accuracy_by_verifiers([c]) is None
