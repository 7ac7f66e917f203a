"""The torch backend of the per-player GRPO trainer (§3.3, Appendix B.3, D.2) on the tiny random Llama."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from unifiedplayers.trainer import grpo
from unifiedplayers.config import TrainerConfig
from unifiedplayers.trainer import (
    EntropyRetention,
    TrainSample,
    atomic_directory,
    build_trainer,
    grad_norm_block_stats,
    mean_token_entropy,
    sample_from_completion,
    selected_token_logprobs,
)
from unifiedplayers.trainer.batching import _collate

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu

CONF = Path(__file__).resolve().parents[2] / "conf" / "trainer"


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _batches(count: int, seed: int = 7, **kw):
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(seed)
    return [synthetic_batch(model, g, **kw) for _ in range(count)]


# ------------------------------------------------------------------ config group
@pytest.mark.parametrize("name", ["torch", "deepspeed_zero2", "deepspeed_zero3"])
def test_trainer_presets_merge_onto_the_schema(name):
    merged = OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    assert merged.backend == name
    with pytest.raises(Exception, match="no_such_key"):
        OmegaConf.merge(merged, {"no_such_key": 1})


def test_unknown_backend_and_names_fail_at_build():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="unknown trainer.backend"):
        build_trainer(trainer_config(backend="jax"), model)
    with pytest.raises(KeyError, match="seq_group_mean"):
        build_trainer(trainer_config(aggregation="median"), model)


# ------------------------------------------------------------------ behaviour log-probs and ratio
def test_first_update_ratio_is_one_and_kl_zero_with_own_behaviour_logprobs():
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(3)
    batch = synthetic_batch(model, g)
    exact = []
    for s in batch:  # behaviour log-probs = the policy's own, no noise
        ids = torch.tensor(s.token_ids)[None]
        own = selected_token_logprobs(model, ids, torch.ones_like(ids), torch.tensor(s.loss_mask)[None].bool())
        exact.append(TrainSample(s.token_ids, s.loss_mask, own.logprobs[0].tolist(), s.advantage, s.group))
    trainer = build_trainer(trainer_config(), model)
    trainer.start_outer_iteration()
    m = trainer.update(exact)
    assert m["actor/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert m["actor/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["actor/kl"] == 0.0  # π_θ = π_ref at the iteration's first update
    assert m["actor/pg_clip_frac"] == 0.0


def test_update_threads_hold_for_the_update_and_the_old_logprob_pass_only():
    model, _ = tiny_model()
    batch = synthetic_batch(model, torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        trainer = build_trainer(trainer_config(num_threads=1, update_threads=2, kl_coef=0.0), model)
        seen = []
        model.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))  # the decoder stack
        trainer.start_outer_iteration()
        trainer.recompute_old_logprobs(batch)
        assert seen and set(seen) == {2} and torch.get_num_threads() == 1
        seen.clear()
        trainer.update(batch)
        assert seen and set(seen) == {2} and torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="empty batch"):
            trainer.update([])
        assert torch.get_num_threads() == 1  # restored when the update fails too
        # 0 leaves the count as it is
        trainer.cfg.update_threads = 0
        seen.clear()
        trainer.update(batch)
        assert set(seen) == {1}
    finally:
        torch.set_num_threads(before)


def test_ratio_uses_recorded_behaviour_logprobs_not_recomputed():
    # Record behaviour log-probs that are log 2 lower than the policy's: ϱ = π_θ/π_old = 2 on every
    # trainable token, so the recorded values, not a recomputation, must have been used.
    model, _ = tiny_model()
    batch = synthetic_batch(model, torch.Generator().manual_seed(4))
    shifted = []
    for s in batch:
        ids = torch.tensor(s.token_ids)[None]
        mask = torch.tensor(s.loss_mask)[None].bool()
        own = selected_token_logprobs(model, ids, torch.ones_like(ids), mask).logprobs[0]
        shifted.append(TrainSample(s.token_ids, s.loss_mask, (own - math.log(2)).tolist(), s.advantage, s.group))
    trainer = build_trainer(trainer_config(kl_coef=0.0), model)
    m = trainer.update(shifted)
    assert m["actor/ratio_mean"] == pytest.approx(2.0, rel=1e-5)
    assert m["actor/clip_frac"] == 1.0
    assert "actor/kl" not in m  # β = 0: no reference pass at all


def test_kl_without_reference_policy_is_an_error():
    model, _ = tiny_model()
    batch = synthetic_batch(model, torch.Generator().manual_seed(5))
    trainer = build_trainer(trainer_config(kl_coef=0.1), model)
    with pytest.raises(RuntimeError, match="start_outer_iteration"):
        trainer.update(batch)  # first update without start_outer_iteration: π_ref undefined
        trainer.update(batch)


# ------------------------------------------------------------------ micro-batching, reference modes
def test_micro_batching_equals_one_big_batch():
    batches = _batches(2)
    results = []
    for mb in (8, 3, 1):
        model, _ = tiny_model()
        trainer = build_trainer(trainer_config(micro_batch_size=mb), model)
        trainer.start_outer_iteration()
        ms = [trainer.update(b) for b in batches]
        results.append((ms, _params(model)))
    (m8, p8) = results[0]
    for ms, params in results[1:]:
        assert ms[-1]["actor/num_micro_batches"] > 1
        for a, b in zip(m8, ms):
            assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=1e-6)
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4)
        for k in p8:  # Adam divides by sqrt(v): float-rounding differences in tiny gradients grow a little
            torch.testing.assert_close(params[k], p8[k], atol=2e-5, rtol=0)


def test_reference_precompute_equals_frozen_copy():
    batches = _batches(3)
    out = {}
    for mode in ("copy", "precompute"):
        model, _ = tiny_model()
        trainer = build_trainer(trainer_config(ref_mode=mode, kl_coef=0.2), model)
        trainer.start_outer_iteration()
        ms = [trainer.update(b) for b in batches]
        out[mode] = (ms, _params(model))
    assert out["copy"][0][-1]["actor/kl"] > 0  # the policy has moved away from π_ref
    for a, b in zip(out["copy"][0], out["precompute"][0]):
        assert b["actor/kl"] == pytest.approx(a["actor/kl"], rel=1e-5, abs=1e-9)
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=1e-6)
    for k, v in out["copy"][1].items():
        torch.testing.assert_close(out["precompute"][1][k], v, atol=1e-6, rtol=0)


def test_reference_stays_fixed_within_an_iteration_and_moves_at_the_next():
    batches = _batches(3)
    model, _ = tiny_model()
    start = _params(model)
    trainer = build_trainer(trainer_config(kl_coef=0.1), model)
    trainer.start_outer_iteration()
    for b in batches:
        trainer.update(b)
    ref = trainer._ref_model.state_dict()
    assert all(torch.equal(ref[k], start[k]) for k in start)
    trainer.start_outer_iteration()
    now = _params(model)
    # Until the iteration's first step the policy is π_ref: the copy is taken then, of the weights before it.
    assert trainer.update(batches[0])["actor/kl"] == 0.0
    assert all(torch.equal(trainer._ref_model.state_dict()[k], now[k]) for k in now)


# ------------------------------------------------------------------ optimizer
def test_grad_norm_is_logged_before_clipping_and_step_is_clipped():
    batch = _batches(1)[0]
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(kl_coef=0.0, grad_clip=1e-3, lr=1.0, weight_decay=0.0), model)

    # The same loss by hand on an identical copy: its unclipped global gradient norm.
    copy_model, _ = tiny_model()
    micro = _collate(batch, grpo.aggregation_weights(
        torch.tensor([[m for m in s.loss_mask] + [0] * (16 - len(s.loss_mask)) for s in batch]),
        torch.tensor([s.group for s in batch])), torch.device("cpu"), pad_id=0)
    lp = selected_token_logprobs(copy_model, micro.input_ids, micro.attention_mask, micro.loss_mask).logprobs
    loss, _ = grpo.policy_loss(lp, micro.old_logprobs, None, micro.advantages, micro.loss_mask, micro.groups,
                               clip_eps=0.2, kl_coef=0.0, sample_weights=micro.weights)
    loss.backward()
    manual = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in copy_model.parameters() if p.grad is not None))

    m = trainer.update(batch)
    assert m["actor/grad_norm"] == pytest.approx(manual, rel=1e-4)
    assert m["actor/grad_norm"] > 100 * 1e-3
    # The step used the clipped gradient: AdamW's first moment after one step is (1 - β1) · g_clipped,
    # so its global norm is 0.1 · clip = 1e-4.
    exp_avg = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert math.sqrt(sum(float(e.pow(2).sum()) for e in exp_avg)) == pytest.approx(1e-4, rel=1e-3)


def test_adamw_settings_and_no_decay_on_norm_gains():
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(), model)
    assert trainer.optimizer is None  # created lazily
    trainer._ensure_optimizer()
    groups = trainer.optimizer.param_groups
    assert groups[0]["betas"] == (0.9, 0.95) and groups[0]["weight_decay"] == 0.01
    assert groups[1]["weight_decay"] == 0.0 and all(p.ndim == 1 for p in groups[1]["params"])
    assert all(p.ndim == 2 for p in groups[0]["params"])


def test_a_player_never_updated_holds_no_optimizer_state_and_offload_round_trips_exactly(tmp_path):
    batches = _batches(4)
    straight_model, _ = tiny_model()
    straight = build_trainer(trainer_config(), straight_model)
    straight.start_outer_iteration()
    for b in batches:
        straight.update(b)

    model, _ = tiny_model()
    offload = tmp_path / "offload"
    trainer = build_trainer(trainer_config(offload_dir=str(offload)), model)
    assert not trainer.has_optimizer_state
    trainer.start_outer_iteration()
    trainer.update(batches[0])
    trainer.update(batches[1])
    assert trainer.has_optimizer_state
    trainer.offload_state()  # block over: the optimizer state leaves memory, for a file without a name
    assert trainer.optimizer is None and not trainer.has_optimizer_state
    assert list(offload.iterdir()) == []  # nothing by name in the offload directory, at any time
    trainer.save_checkpoint(tmp_path / "while_offloaded")  # saving keeps it offloaded
    assert trainer.optimizer is None
    saved = torch.load(tmp_path / "while_offloaded" / "optimizer.pt", weights_only=False)
    assert set(saved) == {"optimizer", "scheduler"} and saved["optimizer"]["state"]  # the offloaded state, whole
    trainer.update(batches[2])  # reloaded lazily
    assert list(offload.iterdir()) == []
    trainer.update(batches[3])
    for k, v in _params(straight_model).items():
        assert torch.equal(_params(model)[k], v), k



def test_a_killed_process_leaves_no_offloaded_state_behind(tmp_path):
    """A run killed while a player is offloaded (kill -9, a timeout) leaves no optimizer-sized file behind: the
    offloaded state lives in a file without a name, whose space the kernel frees with the process. (A named
    file, removed only at a clean exit, once filled a disk with 1.1 GB per killed SmolLM2 run.)"""
    import signal
    import subprocess
    import sys

    offload = tmp_path / "offload"
    script = f"""
import os, signal, sys
from tests.trainer.trainer_helpers import tiny_model, trainer_config
from tests.trainer.test_torch_backend import _batches
from unifiedplayers.trainer import build_trainer
model, _ = tiny_model()
trainer = build_trainer(trainer_config(offload_dir={str(offload)!r}), model)
trainer.start_outer_iteration()
trainer.update(_batches(1)[0])
trainer.offload_state()
fd = trainer._offloaded_to.fileno()
print(os.fstat(fd).st_size, os.fstat(fd).st_nlink, len(os.listdir({str(offload)!r})), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])  # the repository: tests.trainer importable
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    size, links, named = (int(x) for x in proc.stdout.split())
    assert size > 0 and links == 0 and named == 0  # the state was on disk, in a file no directory names
    assert list(offload.iterdir()) == []


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_save_load_continue_equals_uninterrupted_run(tmp_path):
    # Batches are drawn from the *global* torch RNG after the checkpoint, so RNG restoring is tested too.
    def run(model, trainer, steps, sampler_model):
        for _ in range(steps):
            g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
            trainer.update(synthetic_batch(sampler_model, g))

    sampler, _ = tiny_model(seed=5)
    torch.manual_seed(0)
    model_a, _ = tiny_model()
    a = build_trainer(trainer_config(kl_coef=0.1, lr_warmup_steps=3), model_a)
    a.start_outer_iteration()
    run(model_a, a, 2, sampler)
    a.save_checkpoint(tmp_path / "execution")
    run(model_a, a, 3, sampler)
    after_a = torch.rand(3)

    model_b, _ = tiny_model(seed=99)  # different weights: everything must come from the checkpoint
    b = build_trainer(trainer_config(kl_coef=0.1, lr_warmup_steps=3), model_b)
    torch.manual_seed(12345)  # a different RNG state, overwritten by the checkpoint's
    b.load_checkpoint(tmp_path / "execution")
    assert b.global_step == 2 and b.outer_iteration == 1
    run(model_b, b, 3, sampler)
    assert torch.equal(torch.rand(3), after_a)
    pa, pb = _params(model_a), _params(model_b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert a.scheduler.state_dict()["last_epoch"] == b.scheduler.state_dict()["last_epoch"] == 5
    assert a.current_lr() == b.current_lr()


def test_checkpoint_is_atomic(tmp_path):
    target = tmp_path / "planning"
    with atomic_directory(target) as d:
        (d / "x").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as d:
            (d / "x").write_text("half")
            raise RuntimeError("crash while writing")
    assert (target / "x").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["planning"]


def test_checkpoint_of_another_backend_is_refused(tmp_path):
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(), model)
    trainer.save_checkpoint(tmp_path / "ck")
    state = torch.load(tmp_path / "ck" / "trainer_state.pt", weights_only=False)
    state["backend"] = "deepspeed_zero2"
    torch.save(state, tmp_path / "ck" / "trainer_state.pt")
    with pytest.raises(ValueError, match="deepspeed_zero2"):
        trainer.load_checkpoint(tmp_path / "ck")


# ------------------------------------------------------------------ diagnostics (§4.4, Appendix D.2)
def test_grad_norm_block_stats_by_hand():
    # [1, 2, 3, 4, nan]: nan dropped; median 2.5; mean 2.5; population std sqrt(1.25) = 1.118034;
    # CV = 1.118034 / 2.5 = 0.447214.
    s = grad_norm_block_stats([1.0, 2.0, 3.0, 4.0, float("nan")])
    assert s["grad_norm/median"] == 2.5
    assert s["grad_norm/cv"] == pytest.approx(0.447214, abs=1e-6)
    assert s["grad_norm/num_nonfinite"] == 1.0


def test_entropy_bank_initial_value_by_full_softmax_and_retention_ratio():
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(11)
    bank = [torch.randint(3, model.config.vocab_size, (int(n),), generator=g) for n in (5, 9, 3, 7, 4)]
    with torch.no_grad():  # reference: full logits of each context, entropy at every position
        ents = []
        for c in bank:
            logp = torch.log_softmax(model(c[None]).logits[0].float(), -1)
            ents.append(-(logp.exp() * logp).sum(-1))
        expected = float(torch.cat(ents).mean())
    assert mean_token_entropy(model, bank, batch_size=2) == pytest.approx(expected, rel=1e-5)

    trainer = build_trainer(trainer_config(entropy_bank_size=4, entropy_every=1, lr=5e-3), model,
                            entropy_bank=bank)
    assert len(trainer.entropy_bank) == 4  # entropy_bank_size caps the bank
    first = trainer.start_block()["entropy_bank/initial"]
    trainer.start_outer_iteration()
    ms = [trainer.update(b) for b in _batches(3)]
    d = trainer.block_diagnostics()
    assert len(trainer.entropy.history) == 4
    assert d["entropy_bank/retention"] == pytest.approx(ms[-1]["entropy_bank/mean"] / first)
    assert d["entropy_bank/retention"] != 1.0
    assert d["grad_norm/median"] > 0 and math.isfinite(d["grad_norm/cv"])
    r = EntropyRetention()
    r.record(2.0), r.record(1.5)
    assert r.ratio == 0.75


# ------------------------------------------------------------------ rollout contract
def test_sample_from_completion_masks_the_prompt():
    from unifiedplayers.rollout import Completion

    c = Completion(prompt_ids=[5, 6], token_ids=[7, 8, 9], text="abc", logprobs=[-0.1, -0.2, -0.3],
                   finish_reason="length")
    s = sample_from_completion(c, advantage=0.5, group=3)
    assert s.token_ids == [5, 6, 7, 8, 9] and s.loss_mask == [0, 0, 1, 1, 1]
    assert s.old_logprobs == [0.0, 0.0, -0.1, -0.2, -0.3] and s.advantage == 0.5 and s.group == 3
