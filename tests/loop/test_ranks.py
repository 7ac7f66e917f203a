"""The run's one rank boundary (``loop/ranks.py``) in one process: what rank 0's team sends is recorded, then replayed
into :func:`ranks.follow` as rank 1 would receive it. The follower's team must get the same calls in the same order,
run its block of every split job with its own engine and sandbox, refuse a call not declared ``every_rank``, and
stop when rank 0 says so. Source checks hold the rest of ``loop/`` free of rank branches and of collectives outside
declared methods."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from unifiedplayers.distributed import DistContext, prompt_shard
from unifiedplayers.loop import ranks, team as team_module
from unifiedplayers.loop.ranks import every_rank
from unifiedplayers.loop.team import Team as RealTeam

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
    """A team whose every-rank calls record themselves, with the real team's split and pool; its engine, sandbox and
    tokenizer name the rank."""

    split, answer_pool = RealTeam.split, RealTeam.answer_pool

    def __init__(self, name: str, dist) -> None:
        self.name, self.dist, self.calls = name, dist, []
        self.tokenizer, self.sandbox = f"tokenizer of {name}", f"sandbox of {name}"

    def engine(self, role, active):
        self.calls.append(("engine", role, active))
        return f"{self.name}'s {role} engine", {"player": role}

    @every_rank
    def start_block(self, role):
        self.calls.append(("start_block", role))

    @every_rank
    def update(self, role, iteration, batch, on_policy=False):
        self.calls.append(("update", role, iteration, batch, on_policy))
        return {"loss": 1.0}, 0.5


def job(engine, sandbox, tokenizer, prompts):
    """A generation job: each prompt's samples say who made them."""
    return [[(i, engine, sandbox, tokenizer)] for i in prompts]


def test_the_follower_makes_rank_0s_calls_in_order_and_its_block_of_each_split():
    sent = Sent()
    zero = Team("rank 0", sent)
    ranks.start(sent, None, 0)
    zero.start_block("execution")
    rows = zero.split(job, "execution", "planning", 5)
    assert zero.update("execution", 1, ["a"], on_policy=True) == ({"loss": 1.0}, 0.5)  # rank 0 gets the result
    ranks.stop(sent, 3, False)
    assert rows == [[(i, "rank 0's execution engine", "sandbox of rank 0", "tokenizer of rank 0")] for i in range(3)]
    received = Received(sent.messages)
    one = Team("rank 1", received)
    result = ranks.run(received, lambda: pytest.fail("rank 1 led"), lambda start: ranks.follow(received, one))
    assert result == {"completed": 3, "finished": False, "rank": 1} and received.messages == []
    assert one.calls == zero.calls == [("start_block", "execution"), ("engine", "execution", "planning"),
                                       ("update", "execution", 1, ["a"], True)]
    # rank 1 made prompts 3 and 4 of the split with its own engine, sandbox and tokenizer
    assert received.gathered == [[[(i, "rank 1's execution engine", "sandbox of rank 1", "tokenizer of rank 1")]
                                  for i in (3, 4)]]


def test_one_process_sends_nothing_and_runs_every_call_here():
    team = Team("one", DistContext())
    assert team.split(job, "planning", "planning", 2) == [[(i, "one's planning engine", "sandbox of one",
                                                            "tokenizer of one")] for i in range(2)]
    team.update("planning", 0, [])
    ranks.stop(team.dist, 1, True)
    assert team.calls == [("engine", "planning", "planning"), ("update", "planning", 0, [], False)]


def test_a_run_already_complete_stops_the_followers_before_they_set_up():
    sent = Sent()
    ranks.stop(sent, 8, True)
    assert ranks.run(Received(sent.messages), lambda: None, lambda start: pytest.fail("set up")) == {
        "completed": 8, "finished": True, "rank": 1}


@pytest.mark.parametrize("op", ["engine", "retrain_everything"])
def test_a_call_not_declared_every_rank_is_refused_with_its_name(op):
    received = Received([(op, ("execution", "execution"), {})])
    with pytest.raises(RuntimeError, match=f"rank 1 got a call from rank 0 that is not declared every_rank: '{op}'"):
        ranks.follow(received, Team("rank 1", received))


def test_the_team_declares_what_every_rank_runs():
    declared = sorted(name for name, f in vars(RealTeam).items() if getattr(f, "every_rank", False))
    assert declared == ["answer_pool", "block_diagnostics", "end_block", "full_weights", "recompute_old_logprobs",
                        "restore", "restore_rng", "resume_iteration", "save_checkpoint", "split", "start_block",
                        "start_iteration", "update"]


def test_no_rank_branch_in_the_loop_and_collectives_only_in_declared_calls():
    """Only ``loop/ranks.py`` asks which rank this is; a collective elsewhere in ``loop/`` sits in a method declared
    ``every_rank``, which every rank runs."""
    branch = re.compile(r"\bis_main\b|\.broadcast\(|\.barrier\(|dist\.rank\b")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(LOOP.glob("*.py")) if path.name != "ranks.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if branch.search(line)]
    assert found == []
    collective = re.compile(r"split_prompts|\.gather\(|\.all_gather\(")
    undeclared = []
    for path in sorted(LOOP.glob("*.py")):
        if path.name == "ranks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and collective.search(ast.unparse(node)):
                if not any(ast.unparse(d) == "every_rank" for d in node.decorator_list):
                    undeclared.append(f"{path.name}:{node.name}")
    assert undeclared == []


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

    monkeypatch.setattr(team_module, "evaluate_pool", evaluate_pool)
    sent = Sent()
    Team("rank 0", sent).answer_pool("exec cfg", "pool cfg", ["q0", "q1", "q2", "q3"])
    ranks.stop(sent, 1, False)
    received = Received(sent.messages)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    before = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    ranks.follow(received, Team("rank 1", received))
    assert received.gathered == [None] and answered[1] == ("rank 1's execution engine", "sandbox of rank 1", ["q2", "q3"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == before
