"""Adapter players (``trainer.lora.rank`` > 0) on DeepSpeed ZeRO-3 over two ranks (gloo, CPU; ``rollout=vllm`` on
the weight-copying stand-in of tests/distributed/ds_worker.py, which samples the adapter folded into the backbone as
vLLM computes it): the three players' engines partition one shared frozen backbone, every player's adapter moves and
ends equal on both ranks, and the checkpoints hold adapters and their optimizer partitions, not the backbone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import torchrun
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.trainer.deepspeed_backend import DEFAULT_EXTENSIONS_DIR

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("ds_worker.py")


def test_three_adapter_players_train_on_one_partitioned_backbone_over_two_ranks(tmp_path):
    run, dump = tmp_path / "run", tmp_path / "weights"
    torchrun(WORKER, "loop", str(run), str(dump), "trainer.micro_batch_size=1", "schedule.planning_updates=2",
             "trainer=deepspeed_zero3", "rollout.backend=vllm", "trainer.lora.rank=4", "trainer.lr=1e-1",
             env={"TOY_REWARD": "1", "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                                            str(DEFAULT_EXTENSIONS_DIR))},
             timeout=300)
    ranks = [torch.load(f"{dump}.rank{r}.pt", weights_only=False) for r in (0, 1)]
    stepped = {m["block"] for m in read_metrics(run) if m[f"{m['block']}/grad_norm"] > 0}
    assert "planning" in stepped  # two Planning updates: its toy rewards spread (a group of ties has no gradient)
    for role in ("planning", "execution", "evaluation"):
        mine, theirs = ranks[0][role], ranks[1][role]
        assert mine and all("lora_" in k for k in mine), role  # full_state_dict of an adapter player: its adapter
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), role
        moved = any(mine[k].abs().sum() > 0 for k in mine if "lora_B" in k)
        assert moved == (role in stepped), role  # B moved off zero where a step had a gradient, nowhere else
        ckpt = run / "checkpoints" / "iter1" / role
        assert set(torch.load(ckpt / "model.pt", weights_only=True)) == set(mine)
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        assert size < 2_000_000, (role, size)  # adapters and their states; the backbone alone is 1.4 MB in float32
