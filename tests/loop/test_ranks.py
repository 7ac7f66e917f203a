"""The run's one rank boundary (``loop/ranks.py``) in one process: what rank 0's :class:`Leader` sends is recorded,
then replayed into a :class:`Follower` as rank 1 would receive it. The follower's team must get the same calls in the
same order, run its block of every split job with its own engine and sandbox, and stop when rank 0 says so. A source
check holds the rest of ``loop/`` free of rank branches."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from unifiedplayers.distributed import DistContext, prompt_shard
from unifiedplayers.loop import ranks
from unifiedplayers.loop.ranks import TEAM_CALLS, Follower, Leader

pytestmark = pytest.mark.cpu

LOOP = Path(ranks.__file__).parent


class Sent(DistContext):
    """Rank 0 of two whose broadcasts are recorded and whose gathers hold rank 0's part only."""

    def __init__(self) -> None:
        super().__init__(rank=0, world_size=2)
        object.__setattr__(self, "messages", [])

    def broadcast(self, obj):
        self.messages.append(obj)
        return obj

    def split_prompts(self, generate, num_prompts, to_all=True):
        return generate(prompt_shard(num_prompts, 0, 2))


class Received(DistContext):
    """Rank 1 of two that receives ``messages`` in order; its gathers record what it sends to rank 0."""

    def __init__(self, messages) -> None:
        super().__init__(rank=1, world_size=2)
        object.__setattr__(self, "messages", list(messages))
        object.__setattr__(self, "gathered", [])

    def broadcast(self, obj):
        return self.messages.pop(0)

    def split_prompts(self, generate, num_prompts, to_all=True):
        self.gathered.append(generate(prompt_shard(num_prompts, 1, 2)))


class Team:
    """A team that records its calls; its engine names the rank's engine, its tokenizer the rank."""

    def __init__(self, name: str) -> None:
        self.name, self.calls, self.tokenizer = name, [], f"tokenizer of {name}"
        self.players = {"execution": "players"}

    def engine(self, role, active):
        self.calls.append(("engine", role, active))
        return f"{self.name}'s {role} engine", {"player": role}

    def __getattr__(self, name):
        if name not in TEAM_CALLS:
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append((name, *args, *sorted(kwargs.items())))


def job(engine, sandbox, tokenizer, prompts):
    """A generation job: each prompt's samples say who made them."""
    return [[(i, engine, sandbox, tokenizer)] for i in prompts]


def lead(team: Team, dist: Sent, tmp_path: Path) -> dict:
    """Rank 0's side of a short run: every kind of call the outer loop makes."""
    leader = Leader(dist, team)
    leader.start(None, 0)
    published: dict = {}
    leader.start_iteration(tmp_path, published)
    leader.start_block("execution")
    engine, ver = leader.engine("execution", "planning")
    out = {"engine": engine, "ver": ver, "rows": leader.split(job, ("execution", "planning"), 5, "sandbox 0")}
    leader.recompute_old_logprobs("execution", [["a"], ["b"]])
    leader.update("execution", 1, ["a"], on_policy=True)
    leader.block_diagnostics("execution")
    leader.end_block("execution")
    leader.save_checkpoint("execution", tmp_path / "ckpt")
    leader.restore("execution", tmp_path / "ckpt")
    leader.resume_iteration(2)
    leader.restore_rng_state({"python": 1})
    out["players"] = leader.players  # the team's own attributes, on rank 0 only
    leader.stop(3, False)
    return out


def test_the_follower_makes_rank_0s_team_calls_in_order_and_its_block_of_each_split(tmp_path, monkeypatch):
    restored = []
    monkeypatch.setattr(ranks, "restore_rng_state", restored.append)
    sent, zero = Sent(), Team("rank 0")
    out = lead(zero, sent, tmp_path)
    assert out["rows"] == [[(i, "rank 0's execution engine", "sandbox 0", "tokenizer of rank 0")] for i in range(3)]
    assert out["players"] == {"execution": "players"} and out["ver"] == {"player": "execution"}
    received, one = Received(sent.messages), Team("rank 1")
    result = ranks.run(received, lambda: pytest.fail("rank 1 led"),
                       lambda start: Follower(received, one, "sandbox 1").follow())
    assert result == {"completed": 3, "finished": False, "rank": 1}
    assert zero.calls[0] == ("start_iteration", tmp_path, {})  # rank 0 writes the published weights
    assert one.calls[0] == ("start_iteration", None, {})  # rank 1 publishes in memory only
    assert one.calls[1:] == zero.calls[1:] == [
        ("start_block", "execution"), ("engine", "execution", "planning"),
        ("recompute_old_logprobs", "execution", [["a"], ["b"]]), ("update", "execution", 1, ["a"], ("on_policy", True)),
        ("block_diagnostics", "execution"), ("end_block", "execution"), ("save_checkpoint", "execution", tmp_path / "ckpt"),
        ("restore", "execution", tmp_path / "ckpt"), ("resume_iteration", 2)]
    assert {c[0] for c in one.calls} == set(TEAM_CALLS) | {"engine"}  # every call the boundary knows, on rank 1 too
    # rank 1 made prompts 3 and 4 of the split with its own engine, sandbox and tokenizer
    assert received.gathered == [[[(i, "rank 1's execution engine", "sandbox 1", "tokenizer of rank 1")] for i in (3, 4)]]
    assert restored == [{"python": 1}, {"python": 1}] and received.messages == []  # rank 0's, then rank 1's


def test_one_process_sends_nothing_and_runs_every_call_here(tmp_path):
    team = Team("one")
    leader = Leader(DistContext(), team)
    leader.engine("planning", "planning")
    assert leader.split(job, ("planning", "planning"), 2, "box") == [[(0, "one's planning engine", "box", "tokenizer of one")],
                                                                    [(1, "one's planning engine", "box", "tokenizer of one")]]
    leader.update("planning", 0, [])
    leader.stop(1, True)
    assert team.calls == [("engine", "planning", "planning"), ("update", "planning", 0, [])]


def test_a_run_already_complete_stops_the_followers_before_they_set_up():
    sent = Sent()
    Leader(sent, Team("rank 0")).stop(8, True)
    received = Received(sent.messages)
    assert ranks.run(received, lambda: None, lambda start: pytest.fail("set up")) == {
        "completed": 8, "finished": True, "rank": 1}


def test_an_unknown_call_is_refused_with_its_name():
    received = Received([("retrain_everything", (), {})])
    with pytest.raises(RuntimeError, match="rank 1 got an unknown call from rank 0: 'retrain_everything'"):
        Follower(received, Team("rank 1"), None).follow()


def test_no_rank_branch_in_the_loop_outside_the_boundary():
    """Every rank test and every collective of ``loop/`` is in ``loop/ranks.py``."""
    branch = re.compile(r"\bis_main\b|\.broadcast\(|\.gather\(|\.all_gather\(|split_prompts|\.barrier\(|dist\.rank\b")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(LOOP.glob("*.py")) if path.name != "ranks.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if branch.search(line)]
    assert found == []


def test_a_follower_answers_its_block_of_the_pool_and_leaves_the_run_rng_as_it_was(monkeypatch):
    """The diagnostic pool over two ranks: rank 1 answers questions 2 and 3 of 4 with its Execution engine, greedy,
    and the run's RNG streams (which sampling reads next) are where they were before the pool."""
    import random

    import numpy as np
    import torch

    answered = []

    def evaluate_pool(engine, sandbox, tokenizer, execution_cfg, pool_cfg, questions, split):
        random.random(), np.random.rand(), torch.rand(3)  # generation draws from the run's streams
        split(lambda prompts: answered.append((engine, sandbox, [questions[i] for i in prompts])), len(questions))

    monkeypatch.setattr(ranks, "evaluate_pool", evaluate_pool)
    sent = Sent()
    leader = Leader(sent, Team("rank 0"))
    leader.engine("execution", "execution")
    leader.pool_split("exec cfg", "pool cfg", ["q0", "q1", "q2", "q3"])(lambda prompts: None, 4)
    leader.stop(1, False)
    received = Received(sent.messages)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    before = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    Follower(received, Team("rank 1"), "sandbox 1").follow()
    assert received.gathered == [None] and answered == [("rank 1's execution engine", "sandbox 1", ["q2", "q3"])]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == before
