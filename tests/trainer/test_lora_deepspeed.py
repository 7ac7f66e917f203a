"""Adapter players (``trainer.lora.rank`` > 0) on DeepSpeed ZeRO-2 (CPU, gloo): the adapter's steps equal the torch
backend's from the same start, the backbone never moves, and a checkpoint holds the adapter and its optimizer state
without the frozen backbone (DeepSpeed's ``exclude_frozen_parameters``), loading back exactly into a new backbone."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed")

from tests.trainer.test_lora import players  # noqa: E402
from tests.trainer.trainer_helpers import synthetic_batch, trainer_config  # noqa: E402
from unifiedplayers import lora  # noqa: E402
from unifiedplayers.rundir import MODEL_WEIGHTS  # noqa: E402
from unifiedplayers.trainer import build_trainer  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.slow]


def test_zero2_adapter_steps_equal_the_torch_backends_and_checkpoints_hold_the_adapter(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (_, (a,), _), (base, (b,), _) = players(1), players(1)
        frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
        gen = torch.Generator().manual_seed(5)
        batches = [synthetic_batch(a, gen) for _ in range(3)]
        plain = build_trainer(trainer_config(kl_coef=0.05, lr=1e-2), a)
        zero2 = build_trainer(trainer_config(backend="deepspeed_zero2", kl_coef=0.05, lr=1e-2), b)
        for trainer in (plain, zero2):
            trainer.start_outer_iteration()
            for batch in batches[:2]:
                trainer.update(batch)
        want, got = lora.adapter_state(plain.model), lora.adapter_state(zero2.model)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
        assert any(not torch.equal(t, 0 * t) for n, t in got.items() if "lora_B" in n)
        assert all(torch.equal(p, frozen[n]) for n, p in base.named_parameters())
        zero2.save_checkpoint(tmp_path / "ckpt")
        assert set(torch.load(tmp_path / "ckpt" / MODEL_WEIGHTS, weights_only=True)) == set(got)
        stored = sum(f.stat().st_size for f in (tmp_path / "ckpt" / "deepspeed").rglob("*") if f.is_file())
        module_states, = (tmp_path / "ckpt" / "deepspeed").rglob("*model_states.pt")
        held = torch.load(module_states, weights_only=False)["module"]  # DeepSpeed's own copy of the weights
        assert held and all("lora_" in k for k in held), sorted(held)[:3]
        assert stored < 20 * 4 * lora.adapter_parameter_count(b)  # the adapter's states, not the backbone's weights
        zero2.update(batches[2])
        _, (c,), _ = players(1)
        resumed = build_trainer(trainer_config(backend="deepspeed_zero2", kl_coef=0.05, lr=1e-2), c)
        resumed.load_checkpoint(tmp_path / "ckpt")
        resumed.update(batches[2])
        for name, t in lora.adapter_state(zero2.model).items():
            assert torch.equal(lora.adapter_state(resumed.model)[name], t), name
    finally:
        torch.set_num_threads(before)


def test_zero3_adapter_steps_on_one_partitioned_backbone_equal_the_torch_backends():
    """Three ZeRO-3 engines, one per player, partition the one backbone they share; their steps interleave (each
    engine gathers and releases the shared partitions in its forwards), and a player's adapter still takes the torch
    backend's steps."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base, three, _ = players(3)
        _, (alone,), _ = players(1)
        gen = torch.Generator().manual_seed(5)
        batches = [synthetic_batch(alone, gen) for _ in range(3)]
        # every tensor partitioned (DeepSpeed keeps ones under 1e5 elements whole by default: all of the tiny model's),
        # pi_ref swapped in (a copy module would hold the shared backbone's empty partitions: refused, checks.py)
        zero3_cfg = trainer_config(backend="deepspeed_zero3", kl_coef=0.05, lr=1e-2, ref_mode="precompute",
                                   ds_config={"zero_optimization": {"stage3_param_persistence_threshold": 0}})
        zero3 = [build_trainer(zero3_cfg, p) for p in three]
        plain = build_trainer(trainer_config(kl_coef=0.05, lr=1e-2, ref_mode="precompute"), alone)
        assert not any(p.numel() for p in base.parameters() if p.dim() == 2)  # the backbone's matrices partitioned
        for trainer in (*zero3, plain):
            trainer.start_outer_iteration()
        for trainer in zero3:  # every engine steps on the shared backbone
            trainer.update(batches[0])
        for batch in batches[1:]:
            zero3[0].update(batch)
        for batch in batches:
            plain.update(batch)
        want = lora.adapter_state(plain.model)
        with zero3[0].gathered_weights():
            got = {k: v.detach().clone() for k, v in lora.adapter_state(zero3[0].model).items()}
        # ZeRO-3's own linear backward sums in another order than autograd's: after three steps one element of 512
        # was 1.8e-6 apart (rel 2.7e-5); a wrong step would differ by about lr x the gradient, 1e-2 here.
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("extra", [["trainer.ref_mode=copy"], ["schedule.train_planning=false"],
                                   ["schedule.feedback=stale"]])
def test_zero3_refuses_adapter_runs_with_a_module_outside_the_engines(tmp_path, extra):
    from unifiedplayers.config import compose
    from unifiedplayers.loop.outer import OuterLoop

    cfg = ["experiment=tiny", "trainer=deepspeed_zero3", "trainer.lora.rank=4", "trainer.ref_mode=precompute", *extra]
    with pytest.raises(ValueError, match="would hold empty partitions"):
        OuterLoop(compose(cfg), tmp_path)
