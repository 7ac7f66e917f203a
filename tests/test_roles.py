"""The three players and what each one's phase reads: :func:`unifiedplayers.schedule.phase_calls` (which the sampler
makes and the capacity plan reads), the GRPO groups (:func:`unifiedplayers.loop.phase.group_samples`) and the seed
streams. Every player key of the config has a distinct value here, so a key read for the wrong player fails."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from unifiedplayers import roles, schedule
from unifiedplayers.loop import phase, sampling

pytestmark = pytest.mark.cpu

P = OmegaConf.create({"prompts_per_update": 2, "tasks_per_prompt": 3, "tasks_per_update": 1, "num_trajectories": 4,
                      "num_verifiers": 5, "planning_max_new_tokens": 8, "execution_max_new_tokens": 9,
                      "evaluation_max_new_tokens": 10, "max_turns": 2})


def test_the_players_in_block_order():
    assert roles.ROLES == schedule.BLOCK_ORDER == ("planning", "execution", "evaluation")


def test_each_call_samples_and_budgets_with_its_own_players_keys():
    calls = schedule.phase_calls(P, "execution", 1, True, True)
    assert [(c.name, c.prompts, c.samples, c.max_new_tokens, c.turns) for c in calls] == [
        ("tasks", 2, 3, 8, 1), ("trajectories", 1, 4, 9, 2), ("verifiers", 1, 5, 10, 1)]
    assert [c.name for c in schedule.phase_calls(P, "execution", 1, False, False)] == ["tasks", "trajectories"]
    assert schedule.phase_calls(P, "execution", 1, False, True)[1].turns == 1  # no tools: one generation
    assert [c.prompts for c in schedule.phase_calls(P, "evaluation", 3, True, True)] == [6, 3, 3]


def test_a_planning_phase_plays_every_well_formed_task_of_its_round():
    assert [c.prompts for c in schedule.phase_calls(P, "planning", 1, True, True)] == [2, 6, 6]


def test_groups_are_a_prompts_outputs_for_planning_a_tasks_samples_otherwise():
    def task(place, valid):
        return SimpleNamespace(place=place, valid=valid, completion=f"task {place}")

    played = [SimpleNamespace(place=(0, 0), rewards={"planning": 0.5, "execution": [1.0, 0.0], "evaluation": [0.2]},
                              rollouts=[SimpleNamespace(segments=f"segments {i}") for i in range(2)],
                              verifiers=[SimpleNamespace(completion="verifier 0")])]
    makers, rewards, groups = phase.group_samples("planning", [[task((0, 0), True), task((0, 1), False)]], played,
                                                  lambda t: -1.0)
    assert rewards == [0.5, -1.0] and groups == [0, 0]  # a malformed output at the method's reward
    _, rewards, groups = phase.group_samples("execution", [], played + played, lambda t: -1.0)
    assert rewards == [1.0, 0.0, 1.0, 0.0] and groups == [0, 0, 1, 1]
    _, rewards, groups = phase.group_samples("evaluation", [], played, lambda t: -1.0)
    assert rewards == [0.2] and groups == [0]


def test_the_seed_streams_are_pinned():
    """Every run's samples (tests/golden) depend on them."""
    assert (sampling.TASK_STREAM, sampling.TRAJECTORY_STREAM, sampling.VERIFIER_STREAM) == (10, 20, 30)


def test_a_phase_samples_the_calls_the_plan_counts(monkeypatch):
    """The sampler's generation jobs, as phase_calls states them (the capacity plan's source): prompts and
    samples of each call, for a phase that trains Execution and one that trains Planning."""
    from unifiedplayers.players.planning import PlanningTask

    def generate_tasks(engine, tokenizer, player_cfg, first_prompt, num_prompts, n, seed=None, prompts=None):
        return [[PlanningTask("t", f"q{first_prompt + i}.{j}", "7", True, prompt_index=i, topic="t") for j in range(n)]
                for i in range(num_prompts)]

    monkeypatch.setattr(sampling, "generate_tasks", generate_tasks)
    for role in ("execution", "planning"):
        made = []

        def split(job, player, active, num_prompts):
            n = getattr(job, "n", None) or getattr(job, "k", None) or getattr(job, "m", None)
            made.append((num_prompts, n))
            return job(None, None, None, range(num_prompts)) if isinstance(job, sampling.TaskJob) else \
                [[object()] * n for _ in range(num_prompts)]

        team = SimpleNamespace(tokenizer=None, sandbox=None, split=split, sampler=lambda r, a: (None, {}))
        method = SimpleNamespace(use_tools=True, writes_verifiers=True, planning_prompts=lambda tok, p, n: None,
                                 build_task=lambda t, box: t, phase_tasks=lambda r, g, u, un, n: (g, u, un))
        cfg = OmegaConf.create({"seed": 0, "rollout": {"top_p": 1.0}, "trainer": {"roles": {}, "temperature": 1.0}})
        monkeypatch.setattr(sampling, "role_temperature", lambda cfg, role: 1.0)
        s = sampling.PhaseSampler(cfg, OmegaConf.merge(P, {"task_attempts": 1}), P, method, team)
        s.sample(schedule.Update(1, role, 0, 0, 0), 1)
        assert made == [(c.prompts, c.samples) for c in schedule.phase_calls(P, role, 1, True, True)], role
