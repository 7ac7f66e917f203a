"""Players as LoRA adapters on one frozen backbone (``trainer.lora.rank`` > 0, :mod:`unifiedplayers.lora`):
before any update each adapter player computes the backbone's log-probs exactly; an update's adapter gradient equals
autograd through a LoRA layer written out by hand (W x + (α / r) B A x); only adapters have gradients and optimizer
state; π_ref's KL is 0 at an iteration's first update and positive after it; checkpoints and π_ref hold the adapter
alone, and a checkpoint loaded back continues exactly."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config
from unifiedplayers.config import LoraSettings
from unifiedplayers.rundir import MODEL_WEIGHTS, REFERENCE
from unifiedplayers import lora
from unifiedplayers.trainer import build_trainer, selected_token_logprobs

pytestmark = pytest.mark.cpu

SETTINGS = OmegaConf.structured(LoraSettings(rank=4, alpha=8.0))
TARGETS = tuple(SETTINGS.target_modules)


def players(n: int = 3, settings=SETTINGS):
    """The backbone (frozen) and ``n`` adapter players on it, as a run's team builds them."""
    base, tokenizer = tiny_model()
    lora.freeze(base)
    return base, [lora.add_adapter(lora.share_base(base), settings, seed=i) for i in range(n)], tokenizer


def logprobs(model, ids):
    mask, select = torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool)
    select[:, 0] = False  # nothing predicts the first token
    with torch.no_grad():
        return selected_token_logprobs(model, ids, mask, select).logprobs


def test_before_any_update_each_adapter_player_computes_the_backbones_log_probs_exactly():
    pristine, _ = tiny_model()
    base, adapted, _ = players()
    ids = torch.randint(3, pristine.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    want = logprobs(pristine, ids)
    for player in adapted:
        assert torch.equal(logprobs(player, ids), want)
        # B = 0 (PEFT's initialisation) is what makes them equal: A is drawn, and differs between players
        assert all(not t.any() for n, t in lora.adapter_state(player).items() if "lora_B" in n)
    a0, a1 = (lora.adapter_state(p) for p in adapted[:2])
    assert any(not torch.equal(a0[k], a1[k]) for k in a0 if "lora_A" in k)


def test_the_players_share_one_backbone_and_own_only_their_adapter():
    base, adapted, _ = players()
    shared = {id(p) for p in base.parameters()}
    for player in adapted:
        frozen = [p for p in player.parameters() if not p.requires_grad]
        assert frozen and all(id(p) in shared for p in frozen)  # the backbone's own tensors, not copies
        trainable = [n for n, p in player.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        assert all(p.dtype == torch.float32 for p in lora.adapter_parameters(player))
    # 2 layers x 7 projections x (A: r x in, B: out x r) on the test shape (hidden 64, intermediate 128, 2 KV heads)
    hidden, inter, kv, r = 64, 128, 32, 4
    per_layer = r * ((hidden + hidden) + (hidden + kv) * 2 + (hidden + hidden) + (hidden + inter) * 2 + (inter + hidden))
    assert lora.adapter_parameter_count(adapted[0]) == 2 * per_layer


class HandLoRA(torch.nn.Module):
    """y = W x + scale · B A x, written out: W frozen, A and B parameters of their own."""

    def __init__(self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.a, self.b, self.scale = torch.nn.Parameter(a.clone()), torch.nn.Parameter(b.clone()), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.scale * ((x @ self.a.t()) @ self.b.t())


def hand_lora(base: torch.nn.Module, player: torch.nn.Module, scale: float) -> torch.nn.Module:
    """A copy of ``base`` whose target projections are :class:`HandLoRA` layers holding ``player``'s adapter values."""
    hand = copy.deepcopy(base)
    values = lora.adapter_state(player)
    for name, module in list(hand.named_modules()):
        if name.rsplit(".", 1)[-1] not in TARGETS:
            continue
        parent, _, child = name.rpartition(".")
        setattr(hand.get_submodule(parent), child, HandLoRA(
            module.weight, values[f"{name}.lora_A.{lora.ADAPTER}.weight"], values[f"{name}.lora_B.{lora.ADAPTER}.weight"],
            scale))
    return hand


def captured_gradients(trainer) -> dict[str, torch.Tensor]:
    """The gradients of ``trainer``'s next update, read just before its optimizer step."""
    grads: dict[str, torch.Tensor] = {}
    step = trainer._step

    def read_then_step():
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step()

    trainer._step = read_then_step
    return grads


def test_an_updates_adapter_gradient_equals_autograd_through_a_lora_layer_written_by_hand():
    base, (player,), _ = players(1)
    with torch.no_grad():  # B away from zero, so that A's gradient is not zero too
        for n, p in player.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    hand = hand_lora(base, player, SETTINGS.alpha / SETTINGS.rank)
    batch = synthetic_batch(player, torch.Generator().manual_seed(3))
    adapter = build_trainer(trainer_config(kl_coef=0.0), player)
    written = build_trainer(trainer_config(kl_coef=0.0), hand)
    got, want = captured_gradients(adapter), captured_gradients(written)
    adapter.update(batch)
    written.update(batch)
    assert set(got) == {n for n, p in player.named_parameters() if p.requires_grad}  # adapters alone
    compared = 0
    for name, module in hand.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS:
            for mine, theirs in (("lora_A", "a"), ("lora_B", "b")):
                g = got[f"{name}.{mine}.{lora.ADAPTER}.weight"]
                assert g.abs().sum() > 0
                torch.testing.assert_close(g, want[f"{name}.{theirs}"], rtol=1e-5, atol=1e-7)
                compared += 1
    assert compared == 2 * 7 * 2


def test_only_adapters_have_optimizer_state_and_kl_is_zero_at_the_first_update_then_positive():
    base, (player,), _ = players(1)
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    trainer = build_trainer(trainer_config(kl_coef=0.05, lr=1e-2), player)
    trainer.start_outer_iteration()
    gen = torch.Generator().manual_seed(1)
    first = trainer.update(synthetic_batch(player, gen))
    second = trainer.update(synthetic_batch(player, gen))
    assert first["actor/kl"] == 0.0 and second["actor/kl"] > 0.0
    owned = {id(p) for p in lora.adapter_parameters(trainer.model)}
    assert trainer.optimizer.state and all(id(p) in owned for p in trainer.optimizer.state)
    assert all(torch.equal(p, frozen[n]) for n, p in base.named_parameters())  # the backbone never moves
    # π_ref is the adapter at the iteration's start (B = 0), not a model: here a module over the shared backbone
    ref = trainer.held_reference.module
    assert {id(p) for p in ref.parameters() if id(p) not in {id(q) for q in lora.adapter_parameters(ref)}} <= {
        id(p) for p in base.parameters()}
    assert all(not t.any() for n, t in lora.adapter_state(ref).items() if "lora_B" in n)


@pytest.mark.parametrize("ref_mode", ["copy", "precompute"])
def test_a_checkpoint_holds_the_adapter_alone_and_continues_exactly(tmp_path, ref_mode):
    gen = torch.Generator().manual_seed(2)
    (_, (a,), _), (_, (b,), _) = players(1), players(1)  # the same adapter drawn twice, on two backbones
    batches = [synthetic_batch(a, gen) for _ in range(3)]
    cfg = trainer_config(kl_coef=0.05, lr=1e-2, ref_mode=ref_mode)
    whole = build_trainer(cfg, a)
    whole.start_outer_iteration()
    for batch in batches:
        whole.update(batch)
    stopped = build_trainer(cfg, b)
    stopped.start_outer_iteration()
    for batch in batches[:2]:
        stopped.update(batch)
    stopped.save_checkpoint(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / MODEL_WEIGHTS, weights_only=True)
    assert saved.keys() == lora.adapter_state(b).keys()
    assert torch.load(tmp_path / "ckpt" / REFERENCE, weights_only=True).keys() == saved.keys()
    _, (c,), _ = players(1)  # a new process: a new backbone, an adapter drawn anew, then the checkpoint
    resumed = build_trainer(cfg, c)
    resumed.load_checkpoint(tmp_path / "ckpt")
    resumed.update(batches[2])
    for name, t in lora.adapter_state(whole.model).items():
        assert torch.equal(lora.adapter_state(resumed.model)[name], t), name


def test_an_adapter_of_another_shape_is_refused_by_name():
    _, (a,), _ = players(1)
    _, (b,), _ = players(1, OmegaConf.structured(LoraSettings(rank=2, target_modules=["q_proj"])))
    with pytest.raises(ValueError, match="not this player's adapter: missing"):
        lora.load_policy_state(a, lora.adapter_state(b))
    with pytest.raises(ValueError, match="matched no layer"):
        players(1, OmegaConf.structured(LoraSettings(rank=2, target_modules=["no_such_proj"])))


def test_the_merged_weights_compute_what_the_adapter_player_computes():
    base, (player,), _ = players(1)
    with torch.no_grad():
        for n, p in player.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    merged, _ = tiny_model()
    merged.load_state_dict(lora.merged_state(player))
    ids = torch.randint(3, base.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(logprobs(merged, ids), logprobs(player, ids), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p, before[n]) for n, p in base.named_parameters())  # merged into copies


def test_the_adapter_state_is_the_trainable_tensors_alone_and_so_is_a_checkpoint(tmp_path):
    """What a checkpoint, π_ref and a published copy hold: the adapter's tensors, none of the backbone's."""
    base, (player,), _ = players(1)
    state = lora.adapter_state(player)
    assert set(state) == {n for n, p in player.named_parameters() if p.requires_grad}
    assert sum(t.numel() for t in state.values()) == lora.adapter_parameter_count(player)
    trainer = build_trainer(trainer_config(kl_coef=0.05, lr=1e-2), player)
    trainer.start_outer_iteration()
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        trainer.update(synthetic_batch(player, gen))
    trainer.save_checkpoint(tmp_path / "ckpt")
    for name in (MODEL_WEIGHTS, REFERENCE):
        saved = torch.load(tmp_path / "ckpt" / name, weights_only=True)
        assert all("lora_" in k for k in saved), name
        assert sum(t.numel() for t in saved.values()) == lora.adapter_parameter_count(player), name


def test_under_bfloat16_the_adapter_trains_and_an_idle_player_leaves_the_shared_backbone_in_place():
    """trainer.dtype=bfloat16, as a run's team builds it: the shared backbone in bf16, each adapter float32 (its own
    master weights). The adapter's gradients reach its optimizer (no float32 master copy to move them to), and an idle
    player parks nothing of the backbone the other players still compute with."""
    from unifiedplayers.trainer.precision import cast_parameters

    base, _ = tiny_model()
    cast_parameters(lora.freeze(base), torch.bfloat16)
    a, b = (lora.add_adapter(lora.share_base(base), SETTINGS, seed=i) for i in range(2))
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    ids = torch.randint(3, base.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(8))
    others = logprobs(b, ids)
    trainer = build_trainer(trainer_config(kl_coef=0.05, lr=1e-2, dtype="bfloat16"), a)
    trainer.start_outer_iteration()
    gen = torch.Generator().manual_seed(9)
    for _ in range(2):
        assert trainer.update(synthetic_batch(a, gen))["actor/grad_norm"] > 0
    assert trainer.model is a and all(p.dtype == torch.float32 for p in lora.adapter_parameters(a))
    assert any(t.abs().sum() > 0 for n, t in lora.adapter_state(a).items() if "lora_B" in n)  # B moved off zero
    trainer.offload_state()  # its block is over: the others sample on
    assert all(torch.equal(p, frozen[n]) for n, p in base.named_parameters())
    assert torch.equal(logprobs(b, ids), others)


def test_pi_ref_is_the_adapter_at_each_iterations_start_in_both_ref_modes_and_after_a_resume(tmp_path):
    """Appendix B.3: π_ref is the player's parameters at the start of the outer iteration. In iteration 2, after the
    player moved in iteration 1 and went idle, π_ref (copy: a module over the shared backbone; precompute: host
    weights) is the adapter at iteration 2's start, read back so from a checkpoint; the two modes take the same steps."""
    gen = torch.Generator().manual_seed(6)
    (_, (a,), _), (_, (b,), _) = players(1), players(1)
    batches = [synthetic_batch(a, gen) for _ in range(5)]
    trainers = {}
    for mode, model in (("copy", a), ("precompute", b)):
        cfg = trainer_config(kl_coef=0.05, lr=1e-2, ref_mode=mode)
        t = trainers[mode] = build_trainer(cfg, model)
        t.start_outer_iteration()
        for batch in batches[:2]:
            t.update(batch)
        t.offload_state()  # idle between its blocks, as in a run
        start = {k: v.clone() for k, v in lora.adapter_state(t.model).items()}  # iteration 2's start
        assert any(v.abs().sum() > 0 for k, v in start.items() if "lora_B" in k)  # not iteration 1's B = 0
        t.start_outer_iteration()
        assert t.update(batches[2])["actor/kl"] == 0.0
        assert t.update(batches[3])["actor/kl"] > 0.0

        def held(trainer):
            ref = trainer.held_reference
            return lora.adapter_state(ref.module) if mode == "copy" else dict(ref.weights)

        ref = held(t)
        assert set(ref) == set(start) and all(torch.equal(ref[k], start[k]) for k in start), mode
        t.save_checkpoint(tmp_path / mode)
        _, (c,), _ = players(1)
        resumed = build_trainer(cfg, c)
        resumed.load_checkpoint(tmp_path / mode)
        ref = held(resumed)
        assert set(ref) == set(start) and all(torch.equal(ref[k], start[k]) for k in start), mode
        t.update(batches[4])
        resumed.update(batches[4])
        assert all(torch.equal(v, lora.adapter_state(t.model)[k]) for k, v in lora.adapter_state(resumed.model).items())
    want = lora.adapter_state(trainers["copy"].model)
    for k, v in lora.adapter_state(trainers["precompute"].model).items():
        torch.testing.assert_close(v, want[k], rtol=1e-6, atol=1e-7)
