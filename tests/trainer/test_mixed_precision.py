"""bf16 mixed precision of the torch backend, the train/rollout log-prob mismatch and recomputed π_old.

This CPU may have no native bf16: the bf16 path is forced (``dtype="bfloat16"``), which runs anywhere, only slower.
What is checked is the arithmetic's shape, not speed: float32 master weights and optimizer state, a bf16 copy
refreshed after every step, float32 log-probs, gradients that agree with the float32 update, and the mismatch
|log π_train − log π_behaviour| worked out by hand.
"""
from __future__ import annotations

import copy

import pytest
import torch

from unifiedplayers.trainer import TrainSample, build_trainer
from unifiedplayers.trainer.precision import cast_parameters, logprob_mismatch
from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu


def _pair(**overrides):
    """A float32 and a bf16 trainer of the same tiny model, and a batch."""
    model, _ = tiny_model()
    cfg = dict(kl_coef=0.0, weight_decay=0.0, **overrides)
    t32 = build_trainer(trainer_config(dtype="float32", **cfg), copy.deepcopy(model))
    t16 = build_trainer(trainer_config(dtype="bfloat16", **cfg), copy.deepcopy(model))
    batch = synthetic_batch(model, torch.Generator().manual_seed(0))
    return model, t32, t16, batch


def test_bf16_keeps_float32_master_weights_and_optimizer_state_and_refreshes_its_copy():
    model, _, t16, batch = _pair()
    assert all(p.dtype == torch.float32 for p in t16.model.parameters())
    compute = t16.compute_model
    assert compute is not t16.model and all(p.dtype == torch.bfloat16 for p in compute.parameters())
    assert t16.sampling_model(torch.bfloat16) is compute  # one bf16 copy for training and rollouts
    assert t16.sampling_model(torch.float32) is t16.model
    # Buffers keep float32 (the rotary angles are computed in float32).
    assert all(b.dtype == torch.float32 for b in compute.buffers() if b.is_floating_point())
    before = {k: v.clone() for k, v in t16.model.state_dict().items()}
    metrics = t16.update(batch)
    moved = [k for k, v in t16.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "the float32 master weights did not move"
    for state in t16.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    for p32, p16 in zip(t16.model.parameters(), compute.parameters()):
        assert torch.equal(p16, p32.detach().to(torch.bfloat16))  # the copy is the master, rounded, after the step
        assert p16.grad is None  # its gradients went into the master's
    assert metrics["perf/time_weight_sync"] >= 0.0


def test_bf16_update_agrees_with_float32_update():
    """Same batch, same weights: the bf16 step's grad norm and weight change agree with float32's (bf16 has
    8 significant bits, so agreement is to a few per cent), and its log-probs and loss are float32."""
    _, t32, t16, batch = _pair(lr=1e-2)
    before = {k: v.clone() for k, v in t32.model.state_dict().items()}
    m32, m16 = t32.update(batch), t16.update(batch)
    assert m16["actor/grad_norm"] == pytest.approx(m32["actor/grad_norm"], rel=0.05)
    d32 = torch.cat([(p.detach() - before[k]).flatten() for k, p in t32.model.named_parameters()])
    d16 = torch.cat([(p.detach() - before[k]).flatten() for k, p in t16.model.named_parameters()])
    cosine = float(d32 @ d16 / (d32.norm() * d16.norm()))
    assert cosine > 0.95, cosine
    mb = t16.compute_model
    out = t16._forward_module()(torch.tensor([batch[0].token_ids]), torch.ones(1, len(batch[0].token_ids),
                                dtype=torch.long), torch.tensor([batch[0].loss_mask]).bool())
    assert out.logprobs.dtype == torch.float32 and next(mb.parameters()).dtype == torch.bfloat16


def test_torch_backend_never_steps_bf16_weights_even_from_a_bf16_model():
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(dtype="bfloat16", kl_coef=0.0), model.to(torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_float32_has_no_copy_and_no_sync_cost():
    _, t32, _, batch = _pair()
    assert t32.compute_model is t32.model and t32.sampling_model(torch.float32) is t32.model
    t32.update(batch)
    assert t32._copies == {}


def test_reference_pass_runs_in_the_compute_dtype():
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(dtype="bfloat16", kl_coef=0.05), model)
    trainer.start_outer_iteration()
    assert all(p.dtype == torch.bfloat16 for p in trainer._ref_model.parameters())
    batch = synthetic_batch(model, torch.Generator().manual_seed(1))
    trainer.update(batch)
    metrics = trainer.update(batch)  # π_θ ≠ π_ref now: the reference pass runs (k3 KL ≥ 0, finite)
    assert 0.0 < metrics["actor/kl"] < 1.0


def test_bf16_checkpoint_resume_is_exact(tmp_path):
    model, _ = tiny_model()
    gen = torch.Generator().manual_seed(2)
    b1, b2 = synthetic_batch(model, gen), synthetic_batch(model, gen)
    a = build_trainer(trainer_config(dtype="bfloat16"), copy.deepcopy(model))
    a.start_outer_iteration()
    a.update(b1)
    a.save_checkpoint(tmp_path / "ck")
    a.update(b2)
    b = build_trainer(trainer_config(dtype="bfloat16"), copy.deepcopy(model))
    b.load_checkpoint(tmp_path / "ck")
    b.update(b2)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    for pa, pb in zip(a.compute_model.parameters(), b.compute_model.parameters()):
        assert torch.equal(pa, pb)


def test_logprob_mismatch_by_hand():
    train = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    behaviour = torch.tensor([[9.0, -1.5, -1.0, -0.5]])
    mask = torch.tensor([[False, True, True, False]])
    assert logprob_mismatch(train, behaviour, mask) == pytest.approx((0.5 + 1.0) / 2)
    assert logprob_mismatch(train, behaviour, torch.zeros_like(mask)) == 0.0


def test_on_policy_step_reports_the_mismatch_against_behaviour_logprobs():
    """Behaviour log-probs = the trainer's own + 0.25 on every trained token: the reported mismatch is 0.25;
    no mismatch is reported off the on-policy step."""
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(dtype="float32", kl_coef=0.0), model)
    samples = synthetic_batch(model, torch.Generator().manual_seed(3))
    trainer.recompute_old_logprobs(samples)  # old := own forward (exact), behaviour := the noisy ones
    shifted = [TrainSample(s.token_ids, s.loss_mask, [x + 0.25 if m else 0.0 for x, m in
                                                      zip(s.old_logprobs.tolist(), s.loss_mask)], s.advantage, s.group)
               for s in samples]
    metrics = trainer.update(shifted, on_policy=True)
    assert metrics["actor/logprob_mismatch"] == pytest.approx(0.25, abs=1e-5)
    assert "actor/logprob_mismatch" not in trainer.update(shifted)


def test_recompute_old_logprobs_replaces_pi_old_and_keeps_behaviour():
    """trainer.recompute_old_logprobs=true: π_old is the trainer's forward, so the on-policy step's ratio is 1
    (no token outside the clip even with noisy behaviour log-probs), and the mismatch still compares with the
    behaviour log-probs recorded at sampling."""
    model, _ = tiny_model()
    samples = synthetic_batch(model, torch.Generator().manual_seed(4))  # behaviour = own + N(0, 0.1²) noise
    recorded = [list(s.old_logprobs) for s in samples]
    plain = build_trainer(trainer_config(dtype="float32", kl_coef=0.0, clip_eps=0.01), copy.deepcopy(model))
    m_plain = plain.update(copy.deepcopy(samples), on_policy=True)
    trainer = build_trainer(trainer_config(dtype="float32", kl_coef=0.0, clip_eps=0.01), copy.deepcopy(model))
    trainer.recompute_old_logprobs(samples)
    for s, rec in zip(samples, recorded):
        assert s.behaviour_logprobs == rec
        assert not torch.allclose(torch.as_tensor(s.old_logprobs), torch.as_tensor(rec))
    m = trainer.update(samples, on_policy=True)
    assert m_plain["actor/clip_frac"] > 0.3  # noise 0.1 against a clip of 0.01
    assert m["actor/clip_frac"] == 0.0
    assert m["actor/logprob_mismatch"] == pytest.approx(m_plain["actor/logprob_mismatch"], rel=1e-5)
    assert m["actor/logprob_mismatch"] > 0.05


def test_cast_parameters_keeps_ties():
    model, _ = tiny_model()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    cast = cast_parameters(copy.deepcopy(model), torch.bfloat16)
    assert cast.get_output_embeddings().weight is cast.get_input_embeddings().weight
