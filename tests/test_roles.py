"""Each player's shape defined once (``unifiedplayers.roles.SPECS``) and read by sampling, the minibatches and the
capacity plan: a change there moves all three."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from unifiedplayers import capacity, roles, schedule
from unifiedplayers.config import compose, resolve_player_config
from unifiedplayers.loop import phase, sampling

pytestmark = pytest.mark.cpu


def test_the_specs_name_every_player_in_block_order():
    assert tuple(roles.SPECS) == roles.ROLES
    assert [roles.spec(r).call for r in roles.ROLES] == ["tasks", "trajectories", "verifiers"]
    assert [roles.spec(r).grouped_by for r in roles.ROLES] == ["prompt", "task", "task"]
    with pytest.raises(KeyError, match="unknown role 'judge': one of planning, execution, evaluation"):
        roles.spec("judge")


def test_a_players_shape_is_read_by_sampling_and_the_capacity_plan(monkeypatch):
    """Evaluation sampling num_trajectories per task instead of num_verifiers: the phase's calls and the plan's
    Evaluation rows both follow."""
    cfg = compose(["experiment=paper_qwen3_4b"])
    p = resolve_player_config(cfg)
    before = schedule.phase_calls(p, "execution", 1, True, True)
    rows = capacity.role_loads(cfg)["evaluation"].rows
    assert before[2].samples == p.num_verifiers != p.num_trajectories
    changed = dict(roles.SPECS, evaluation=dataclasses.replace(roles.SPECS["evaluation"], samples_key="num_trajectories"))
    monkeypatch.setattr(roles, "SPECS", changed)
    monkeypatch.setattr(schedule, "SPECS", changed)
    after = schedule.phase_calls(p, "execution", 1, True, True)
    assert after[2].samples == p.num_trajectories
    assert capacity.role_loads(cfg)["evaluation"].rows == rows // p.num_verifiers * p.num_trajectories


def test_the_grouping_decides_what_a_phase_plays_and_how_groups_are_made(monkeypatch):
    """A player grouped by prompt plays every well-formed task of a round; grouped by task, tasks_per_update an
    update. And its samples come from the played task's field the spec names."""
    p = OmegaConf.create({"prompts_per_update": 2, "tasks_per_prompt": 3, "tasks_per_update": 1, "num_trajectories": 4,
                          "num_verifiers": 5, "planning_max_new_tokens": 8, "execution_max_new_tokens": 9,
                          "evaluation_max_new_tokens": 10, "max_turns": 2})
    assert schedule.phase_calls(p, "planning", 1, True, True)[1].prompts == 6  # every task of the round
    assert schedule.phase_calls(p, "execution", 1, True, True)[1].prompts == 1

    class Played:
        verifiers = [type("V", (), {"completion": object()})() for _ in range(5)]
        rewards = {"evaluation": [1.0, 0.0, 1.0, 0.0, 1.0]}

    makers, rewards, groups = phase.group_samples("evaluation", [], [Played(), Played()], lambda t: -1.0)
    assert len(makers) == 10 and rewards[:5] == Played.rewards["evaluation"] and groups == [0] * 5 + [1] * 5
    monkeypatch.setattr(roles, "SPECS", dict(roles.SPECS, evaluation=dataclasses.replace(
        roles.SPECS["evaluation"], played_samples="rollouts")))
    with pytest.raises(AttributeError, match="rollouts"):
        phase.group_samples("evaluation", [], [Played()], lambda t: -1.0)


def test_each_players_keys_name_what_that_player_reads():
    """The keys pinned to what the rest of the code reads: ``players/planning.py`` samples ``tasks_per_prompt`` tasks
    of ``planning_max_new_tokens``, the sampler and ``players/tool_loop.py`` ``num_trajectories`` trajectories of
    ``execution_max_new_tokens`` a turn, ``players/evaluation.py`` ``num_verifiers`` verifiers of
    ``evaluation_max_new_tokens``; a task's samples are ``PlayedTask.rollouts`` and ``.verifiers``; the streams seed
    every run (``tests/golden``). Two players' keys swapped fails here, and in the calls of a phase."""
    pinned = {  # call, samples_key, tokens_key, played_samples, stream, multi_turn
        "planning": ("tasks", "tasks_per_prompt", "planning_max_new_tokens", None, 10, False),
        "execution": ("trajectories", "num_trajectories", "execution_max_new_tokens", "rollouts", 20, True),
        "evaluation": ("verifiers", "num_verifiers", "evaluation_max_new_tokens", "verifiers", 30, False),
    }
    assert {r: (s.call, s.samples_key, s.tokens_key, s.played_samples, s.stream, s.multi_turn)
            for r, s in roles.SPECS.items()} == pinned
    assert all(roles.spec(r).name == r for r in roles.ROLES)
    fields = {f.name for f in dataclasses.fields(sampling.PlayedTask)}
    assert {"rollouts", "verifiers"} <= fields
    # every key a different value: each call samples and budgets with its own player's
    p = OmegaConf.create({"prompts_per_update": 2, "tasks_per_prompt": 3, "tasks_per_update": 1, "num_trajectories": 4,
                          "num_verifiers": 5, "planning_max_new_tokens": 8, "execution_max_new_tokens": 9,
                          "evaluation_max_new_tokens": 10, "max_turns": 2})
    calls = schedule.phase_calls(p, "execution", 1, True, True)
    assert {c.name: (c.samples, c.max_new_tokens, c.turns) for c in calls} == {
        "tasks": (3, 8, 1), "trajectories": (4, 9, 2), "verifiers": (5, 10, 1)}
