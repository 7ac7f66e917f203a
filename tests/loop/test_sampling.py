"""A phase's Planning prompts (``PhaseSampler.tasks``, ``loop/sampling.py``) without a model: which questioner
prompts (topics) each attempt and each rank asks, how the Planning outputs are numbered, and the prompt counter
left for the next phase. ``generate_tasks`` is replaced by a stand-in that says what it was asked."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from unifiedplayers.config import compose, resolve_player_config
from unifiedplayers.distributed import DistContext, prompt_shard
from unifiedplayers.loop import sampling
from unifiedplayers.loop.team import Team
from unifiedplayers.loop.sampling import TASK_STREAM, PhaseSampler
from unifiedplayers.schedule import Update, seed_for
from unifiedplayers.players.planning import PlanningTask

pytestmark = pytest.mark.cpu

START = 5  # the prompt counter at the phase's start (the questioner prompts earlier phases used)


class TwoRanks(DistContext):
    """Rank 0 of two, whose collectives see rank 1's part as rank 1 would make it: the same call on its block of
    prompts (every rank holds the same sampler state)."""

    def __init__(self) -> None:
        super().__init__(rank=0, world_size=2)

    def split_prompts(self, generate, num_prompts, to_all=True):
        object.__setattr__(self, "_call", (generate, num_prompts))
        return super().split_prompts(generate, num_prompts, to_all)

    def all_gather(self, obj):
        generate, num_prompts = self._call
        return [obj, generate(prompt_shard(num_prompts, 1, 2))]

    def gather(self, obj):
        return self.all_gather(obj)

    def broadcast(self, obj):
        return obj


def sampler(monkeypatch, dist, prompts_per_update: int, valid_from: int):
    """A sampler for phases of one update with ``prompts_per_update`` prompts and two attempts; a task is
    well-formed when its topic index is at least ``valid_from``. Returns it and the stand-in's calls."""
    cfg = compose(["experiment=tiny", f"player.prompts_per_update={prompts_per_update}", "player.task_attempts=2"])
    p = resolve_player_config(cfg)
    calls = []

    def generate_tasks(engine, tokenizer, player_cfg, first_prompt, num_prompts, n, seed=None, prompts=None):
        """As players.planning.generate_tasks: ``out[i][g]``, numbered ``i`` within the call, topic first_prompt + i."""
        calls.append((first_prompt, num_prompts, seed))
        return [[PlanningTask(f"topic {first_prompt + i}", "q", "7", first_prompt + i >= valid_from, prompt_index=i,
                              topic=str(first_prompt + i)) for _ in range(n)] for i in range(num_prompts)]

    monkeypatch.setattr(sampling, "generate_tasks", generate_tasks)
    method = SimpleNamespace(use_tools=True, planning_prompts=lambda tok, p, n: None, build_task=lambda t, box: t,
                             phase_tasks=lambda role, groups, used, unused, n: (groups, used, unused))
    team = SimpleNamespace(tokenizer=None, sandbox=None, dist=dist, engine=lambda role, active: (None, {}))
    team.split = lambda *args: Team.split(team, *args)  # the real split over the stand-in's ranks
    return PhaseSampler(cfg, p, p, method, team, prompt_counter=START), calls


SLOT = Update(iteration=1, role="execution", step_in_block=0, step_in_phase=0, index=3)


def test_a_failed_attempt_moves_on_to_new_prompts_numbered_after_its_own(monkeypatch):
    """task_attempts = 2, the first attempt's tasks all malformed: the second asks the next prompts (other topics),
    its outputs are numbered after the first's, and the counter moves past both."""
    s, calls = sampler(monkeypatch, DistContext(), prompts_per_update=1, valid_from=START + 1)
    groups, used, unused = s.tasks(SLOT, 1)
    assert [c[:2] for c in calls] == [(START, 1), (START + 1, 1)]
    assert calls[0][2] != calls[1][2]  # each attempt has its own seed stream
    assert [[t.prompt_index for t in g] for g in groups] == [[0, 0], [1, 1]]
    assert [t.topic for t in used] == [str(START + 1)] and [t.topic for t in unused] == [str(START + 1)]
    assert [t.place for t in used] == [(1, 0)]
    assert s.prompt_counter == START + 2


def test_each_rank_asks_its_own_block_of_prompts_and_numbers_them_in_the_call(monkeypatch):
    """Four prompts over two ranks: rank 1 asks prompts 2 and 3 (their topics, their seeds), numbered 2 and 3, as one
    process asks them; a second attempt goes on after all four."""
    s, calls = sampler(monkeypatch, TwoRanks(), prompts_per_update=4, valid_from=START + 4)
    groups, used, _ = s.tasks(SLOT, 1)
    n = s.player_cfg.tasks_per_prompt
    base = [seed_for(s.cfg.seed, SLOT.phase_first, TASK_STREAM + a) for a in (0, 1)]
    assert calls == [(START, 2, base[0]), (START + 2, 2, base[0] + 2 * n),
                     (START + 4, 2, base[1]), (START + 6, 2, base[1] + 2 * n)]
    assert [g[0].prompt_index for g in groups] == list(range(8))
    assert [g[0].topic for g in groups] == [str(START + i) for i in range(8)]
    assert [t.topic for t in used] == [str(START + 4)] and s.prompt_counter == START + 8
