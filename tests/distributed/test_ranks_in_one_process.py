"""What each rank of a data-parallel run does, checked in one process (no launcher, no GPU):

- rollouts are split by prompt (:func:`prompt_shard`, :meth:`DistContext.split_prompts`): every rank busy where
  there are as many prompts as ranks, every prompt's samples made by one rank, the prompt order given back, and
  each sample seeded the same whichever rank makes it (vLLM's per-sample seeds; ``loop.sampling``'s generation jobs);
- device pinning (:func:`init_distributed`): with the node's GPUs faked (``torch.cuda`` patched), DeepSpeed's
  device (``cuda:$LOCAL_RANK``), vLLM's in-process worker (``cuda:0``) and the current device are all the GPU of
  the launcher's ``LOCAL_RANK``.
"""
from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import unifiedplayers.distributed as D
from unifiedplayers.distributed import DistContext, prompt_shard, share
from unifiedplayers.loop import sampling

pytestmark = [pytest.mark.cpu]


# ---------------------------------------------------------------------------------------------- sharding
def test_share_splits_n_items_over_the_ranks():
    assert [share(8, r, 3) for r in range(3)] == [3, 3, 2]
    assert [share(1, r, 2) for r in range(2)] == [1, 0]
    assert sum(share(7, r, 4) for r in range(4)) == 7
    single = DistContext()
    assert single.broadcast("x") == "x" and single.gather(1) == [1] and not single.enabled


@pytest.mark.parametrize("prompts, world, blocks", [
    (4, 1, [[0, 1, 2, 3]]),
    (4, 2, [[0, 1], [2, 3]]),
    (4, 3, [[0, 1], [2], [3]]),
    (4, 8, [[0], [1], [2], [3], [], [], [], []]),  # fewer prompts than ranks: four ranks idle
    (8, 8, [[i] for i in range(8)]),  # the paper presets' 8 tasks of a phase on 8 GPUs
    (10, 3, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]),
    (17, 8, [[0, 1, 2], *[[3 + 2 * i, 4 + 2 * i] for i in range(7)]]),
    (0, 2, [[], []]),
])
def test_prompt_shards_by_hand(prompts, world, blocks):
    assert [list(prompt_shard(prompts, r, world)) for r in range(world)] == blocks


class _Ranks(DistContext):
    """Rank ``rank`` of ``world_size``, whose collectives see the other ranks' parts as ``generate`` makes them."""

    def __init__(self, rank: int, world_size: int, generate, num_prompts: int) -> None:
        super().__init__(rank=rank, world_size=world_size)
        object.__setattr__(self, "_others", (generate, num_prompts))

    def all_gather(self, obj):
        generate, num_prompts = self._others
        parts = [generate(prompt_shard(num_prompts, r, self.world_size), r) for r in range(self.world_size)]
        parts[self.rank] = obj
        return [p if p is not None else [] for p in parts]

    def gather(self, obj):
        return self.all_gather(obj) if self.is_main else None


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("prompts, n", [(4, 8), (8, 4), (3, 2)])
def test_split_prompts_gives_each_rank_whole_prompts_and_the_prompt_order_back(world, prompts, n):
    """A rank makes all n samples of each of its prompts in one call; every rank gets every prompt's samples back,
    in prompt order; every rank has a call where there are at least as many prompts as ranks."""
    calls: dict[int, list[int]] = {}

    def generate(mine, rank):
        if not len(mine):
            return None  # never called for a rank without prompts (checked below)
        return [[(i, j, rank) for j in range(n)] for i in mine]

    for rank in range(world):
        def own(mine, rank=rank):
            calls[rank] = list(mine)
            return generate(mine, rank)

        ctx = _Ranks(rank, world, generate, prompts) if world > 1 else DistContext()
        out = ctx.split_prompts(own, prompts)
        assert [[(i, j) for i, j, _ in row] for row in out] == [[(i, j) for j in range(n)] for i in range(prompts)]
        makers = {i: {r for _, _, r in row} for i, row in enumerate(out)}
        assert all(len(m) == 1 for m in makers.values())  # no prompt split over ranks
        if not rank:
            assert ctx.split_prompts(own, prompts, to_all=False) is not None
        elif world > 1:
            assert ctx.split_prompts(own, prompts, to_all=False) is None  # rank 0 only
    assert sorted(calls) == [r for r in range(world) if len(prompt_shard(prompts, r, world))]
    if prompts >= world:
        assert len(calls) == world  # every rank busy
    assert [i for r in sorted(calls) for i in calls[r]] == list(range(prompts))


def _seeded(rows: int, n: int, seed: int) -> list[list[Any]]:
    """A generation call's stand-in: each sample says its seed and its prompt's place within the call."""
    return [[SimpleNamespace(seed=seed + i * n + j, prompt_index=i) for j in range(n)] for i in range(rows)]


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("kind", ["tasks", "solve", "verifiers"])
def test_each_sample_has_the_same_seed_whichever_rank_makes_it(world, kind, monkeypatch):
    """vLLM seeds sample j of a call's i-th prompt with the call's seed + i·n + j (rollout/vllm_engine.py), so a
    sample's seed is that of the one-process call whichever rank's block of prompts holds it: each generation job
    seeds its block from ``start`` with seed + start·n (rank 0's: the one-process seed), and a task is numbered by
    its prompt's place in the whole call."""
    monkeypatch.setattr(sampling, "generate_tasks", lambda e, t, p, first, rows, n, seed, prompts: _seeded(rows, n, seed))
    monkeypatch.setattr(sampling, "solve", lambda e, b, t, c, qs, n, seed, **kw: _seeded(len(qs), n, seed))
    monkeypatch.setattr(sampling, "write_verifiers", lambda e, t, p, qs, n, seed: _seeded(len(qs), n, seed))
    prompts, n, base, questions = 8, 4, 1000, [f"q{i}" for i in range(8)]
    job = {"tasks": sampling.TaskJob(None, 0, n, base, None),
           "solve": sampling.SolveJob(None, questions, n, base, 1.0, 1.0),
           "verifiers": sampling.VerifierJob(None, questions, n, base)}[kind]
    rows = [row for rank in range(world) for row in job(None, None, None, prompt_shard(prompts, rank, world))]
    assert [[x.seed for x in row] for row in rows] == [[base + i * n + j for j in range(n)] for i in range(prompts)]
    if kind == "tasks":
        assert [row[0].prompt_index for row in rows] == list(range(prompts))


# ---------------------------------------------------------------------------------------------- device pinning
NODE = [str(i) for i in range(8)]  # nvidia-smi's indices of an 8-GPU node


def _visible() -> list[str]:
    """The GPUs CUDA would see in this process, from CUDA_VISIBLE_DEVICES (the node's when unset)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return NODE if value is None else [d for d in value.split(",") if d]


@pytest.fixture
def fake_node(monkeypatch):
    """An 8-GPU node as torch and nvidia-smi see it, a process group that is only recorded, and the environment
    restored afterwards. Returns what was called."""
    calls = SimpleNamespace(set_device=[], init=[])
    for key in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(_visible()))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(_visible()))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.set_device.append(int(d)))
    smi = "".join(f"{i}\n" for i in NODE)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stdout=smi))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kw: calls.init.append(backend))
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: calls.init[-1])
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: "gloo-group")
    monkeypatch.setattr(D, "_OBJECT_GROUP", None)
    return calls


def _launch(monkeypatch, local_rank: int, world: int = 8, visible=None) -> None:
    """The variables torchrun gives rank ``local_rank`` of one node."""
    for key, value in {"RANK": local_rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world}.items():
        monkeypatch.setenv(key, str(value))
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def _gpus_used(calls) -> dict[str, str]:
    """The node GPU each consumer ends on: DeepSpeed (cuda:$LOCAL_RANK), vLLM's uni-process worker (cuda:0),
    and the current device we set. An ordinal CUDA does not have is named as such."""
    visible = _visible()
    name = lambda ordinal: visible[ordinal] if ordinal < len(visible) else f"no device {ordinal}"  # noqa: E731
    return {"deepspeed": name(int(os.environ["LOCAL_RANK"])), "vllm": name(0), "current": name(calls.set_device[-1])}


@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_every_library_gets_the_gpu_of_the_launchers_local_rank(fake_node, monkeypatch, local_rank):
    _launch(monkeypatch, local_rank)
    ctx = D.init_distributed()
    assert (ctx.rank, ctx.local_rank, ctx.world_size) == (local_rank, local_rank, 8)
    assert fake_node.init == ["nccl"]
    assert _gpus_used(fake_node) == dict.fromkeys(("deepspeed", "vllm", "current"), NODE[local_rank])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == NODE[local_rank] and os.environ["LOCAL_RANK"] == "0"


def test_a_visible_list_is_narrowed_by_position(fake_node, monkeypatch):
    _launch(monkeypatch, 1, world=2, visible="4,6")  # the user gave this job GPUs 4 and 6
    D.init_distributed()
    assert _gpus_used(fake_node) == dict.fromkeys(("deepspeed", "vllm", "current"), "6")


def test_a_rank_already_bound_to_one_gpu(fake_node, monkeypatch):
    """Slurm's --gpu-bind: each task sees its own GPU only, and LOCAL_RANK still counts the node's tasks."""
    _launch(monkeypatch, 5, visible="5")
    D.init_distributed()
    assert _gpus_used(fake_node) == dict.fromkeys(("deepspeed", "vllm", "current"), "5")


def test_more_ranks_than_gpus_is_refused(fake_node, monkeypatch):
    _launch(monkeypatch, 2, world=3, visible="0,1")
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 but only 2 GPUs"):
        D.init_distributed()


def test_without_pinning_every_gpu_stays_visible_and_the_local_rank_is_current(fake_node, monkeypatch):
    """pin_gpu=False: verl's and TRL's layout for the trainer (an in-process vLLM engine would take cuda:0)."""
    _launch(monkeypatch, 3)
    D.init_distributed(pin_gpu=False)
    assert _gpus_used(fake_node) == {"deepspeed": "3", "vllm": "0", "current": "3"}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_node_without_gpus_changes_nothing(fake_node, monkeypatch):
    _launch(monkeypatch, 1, world=2, visible="")
    D.init_distributed()
    assert fake_node.init == ["gloo"] and not fake_node.set_device
    assert os.environ["LOCAL_RANK"] == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # and without nvidia-smi, nothing to pin either
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("nvidia-smi")))
    assert D._listed_gpus() == []
