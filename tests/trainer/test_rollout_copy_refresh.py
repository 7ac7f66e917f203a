"""The rollout copy of the torch backend in another dtype than its compute dtype (``trainer.dtype=float32``,
``model.dtype=bfloat16``): the module the engine samples from is refreshed after every step, not only the
compute copy."""
from __future__ import annotations

import pytest
import torch

from unifiedplayers.trainer import build_trainer
from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu


def test_bf16_sampling_copy_is_the_float32_master_rounded_after_each_step():
    """Catches the plant "skip refreshing copies whose dtype differs from the compute dtype" in
    ``TorchTrainer._sync_copies``: the bf16 copy would keep the weights from before the step."""
    model, _ = tiny_model()
    batch = synthetic_batch(model, torch.Generator().manual_seed(0))
    trainer = build_trainer(trainer_config(dtype="float32", kl_coef=0.0, lr=1e-2), model)
    assert trainer.compute_dtype == torch.float32
    sampling = trainer.sampling_model(torch.bfloat16)  # what the team hands the rollout engine, once
    assert sampling is not trainer.model and all(p.dtype == torch.bfloat16 for p in sampling.parameters())
    trainer.offload_state()  # idle until its block, as in the team
    for step in range(2):
        before = [p.detach().clone() for p in sampling.parameters()]
        trainer.update(batch)
        assert trainer.sampling_model(torch.bfloat16) is sampling  # the engine keeps the same module
        masters = list(trainer.model.parameters())
        assert any(not torch.equal(p, b) for p, b in zip(sampling.parameters(), before)), f"step {step}: copy unchanged"
        for (name, p16), p32 in zip(sampling.named_parameters(), masters):
            assert p16.dtype == torch.bfloat16 and p16.grad is None, name
            assert torch.equal(p16, p32.detach().to(torch.bfloat16)), f"step {step}: {name} is not the master rounded"
