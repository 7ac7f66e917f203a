"""Host memory of idle players: an idle player keeps in memory only the weights it samples with.

- Team level, torch backend in bf16 (float32 masters, one bf16 copy for compute and rollouts), both reference modes:
  after its block ends a player holds no optimizer state, no gradients, no π_ref and no float32 masters; a player that
  has not trained yet in the iteration holds no π_ref; the active one holds what it trains with. Before: every player
  kept its masters and π_ref, whatever it was doing.
- Trainer level: parking and bringing back changes no bit (weights and metrics equal an uninterrupted trainer's), for
  the torch backend and for DeepSpeed ZeRO-3 with ZeRO-Offload (the paper presets), whose idle engine parks every host
  tensor of its optimizer (master partitions, Adam moments, gradient buffers) while its weights stay for sampling.
- Two ranks (torchrun, gloo): under ZeRO-3 with ``ref_mode: precompute`` only rank 0 keeps π_ref; rank 1's KL terms
  are still the single process's. Before: every rank kept a full copy. That test runs in the two-rank DeepSpeed
  launch of tests/distributed/test_data_parallel_deepspeed.py (one start-up of the ranks for all its jobs).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from unifiedplayers.config import compose, resolve_player_config
from unifiedplayers.distributed import SINGLE
from unifiedplayers.schedule import trained_roles
from unifiedplayers.loop.team import Team
from unifiedplayers.trainer import build_trainer

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu

ITEMS = ("sampling weights", "master weights", "optimizer state", "gradients", "reference")


def _bytes(tensors, seen: set) -> int:
    """Host bytes of the storages of ``tensors`` not counted yet (``seen``)."""
    total = 0
    for t in tensors:
        if t is None or t.device.type != "cpu":
            continue
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def held(player) -> dict[str, int]:
    """Host bytes one torch-backend player holds, by item (each storage counted once, in the first item naming it).
    The trainer's weights are read as held (``held_weights``): ``trainer.model`` would bring parked masters back."""
    trainer, seen = player.trainer, set()
    weights = trainer.held_weights
    masters = list(weights.masters.parameters())
    optimizer = [] if trainer.optimizer is None else [t for s in trainer.optimizer.state.values() for t in s.values()]
    copies = [p for m in weights.copies.values() for p in m.parameters()]
    ref = trainer.held_reference
    reference = (list(ref.module.parameters()) if ref.module is not None else []) + list(ref.weights.values())
    return {
        "sampling weights": _bytes(player.model.parameters(), seen),
        "master weights": _bytes(masters, seen),
        "optimizer state": _bytes(optimizer, seen),
        "gradients": _bytes([p.grad for p in masters + copies], seen),
        "reference": _bytes(reference, seen),
    }


def _team(ref_mode: str, tmp_path: Path, shared_model: bool = False) -> Team:
    cfg = compose(["experiment=tiny", "model.dtype=bfloat16", "trainer.dtype=bfloat16", f"trainer.ref_mode={ref_mode}",
                   "trainer.kl_coef=0.05", "trainer.micro_batch_size=4", f"trainer.offload_dir={tmp_path / 'offload'}"])
    team = Team(cfg, resolve_player_config(cfg), trained_roles(cfg), shared_model, SINGLE)
    team.setup(*team.load_backbone(None, {"model_load_s": 0.0}))
    return team


@pytest.mark.parametrize("ref_mode", ["copy", "precompute"])
def test_an_idle_player_holds_only_the_weights_it_samples_with(ref_mode, tmp_path):
    team = _team(ref_mode, tmp_path)
    g = torch.Generator().manual_seed(0)
    batch = synthetic_batch(team.players["planning"].model, g)
    weights = {role: held(p)["sampling weights"] for role, p in team.players.items()}
    assert all(w > 0 for w in weights.values())

    def only_sampling_weights(role):
        return held(team.players[role]) == {**dict.fromkeys(ITEMS, 0), "sampling weights": weights[role]}

    assert all(only_sampling_weights(role) for role in team.players)  # built: every player idle until its block
    team.start_iteration()
    for role in ("planning", "execution"):
        team.start_block(role)
        for step in range(2):
            team.update(role, 1, batch, on_policy=step == 0)
        active = held(team.players[role])
        assert active["master weights"] and active["optimizer state"] and active["reference"]  # what it trains with
        assert active["gradients"] == 0  # freed at each step
        assert all(only_sampling_weights(other) for other in team.players if other != role)
        team.end_block(role)
        assert only_sampling_weights(role)
    assert list((tmp_path / "offload").iterdir()) == []  # parked in files without a name


def _tensors(value, depth: int = 3):
    """The tensors in ``value`` (lists, tuples and dicts of them, ``depth`` deep) and their gradients."""
    if isinstance(value, torch.Tensor):
        yield value
        if value.is_leaf and value.grad is not None:
            yield value.grad
    elif depth and isinstance(value, (list, tuple, dict)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v, depth - 1)


def _updates(trainer, batches, idle_between: bool):
    """Two outer iterations of updates on ``batches``; ``idle_between``: the player goes idle before every update."""
    metrics = []
    for iteration in range(2):
        trainer.start_outer_iteration()
        for b in batches:
            if idle_between:
                trainer.offload_state()
            metrics.append(trainer.update(b))
    return metrics


def _same_run(a, b, metrics_a, metrics_b):
    for x, y in zip(metrics_a, metrics_b):
        for key in ("actor/loss", "actor/kl", "actor/grad_norm"):
            assert x[key] == y[key], key
    sa, sb = a.full_state_dict(), b.full_state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("ref_mode", ["copy", "precompute"])
def test_parked_and_back_the_torch_trainer_changes_no_bit(ref_mode, tmp_path):
    g = torch.Generator().manual_seed(3)
    batches = [synthetic_batch(tiny_model()[0], g) for _ in range(3)]
    cfg = trainer_config(dtype="bfloat16", ref_mode=ref_mode, kl_coef=0.1, offload_dir=str(tmp_path))
    straight, idle = build_trainer(cfg, tiny_model()[0]), build_trainer(cfg, tiny_model()[0])
    idle.sampling_model(torch.bfloat16)  # it samples from its bf16 copy, as a team's player does
    straight_metrics = _updates(straight, batches, idle_between=False)
    idle_metrics = _updates(idle, batches, idle_between=True)
    assert idle_metrics[-1]["actor/kl"] > 0
    held, reference = straight.held_reference, idle.held_reference  # where π_ref is, as a benchmark reads it
    assert (held.module is not None, bool(held.weights)) == ((True, False) if ref_mode == "copy" else (False, True))
    assert all(t.device.type == "cpu" for t in held.weights.values()) and held.parked_bytes == 0
    with pytest.raises(TypeError):
        held.weights["x"] = torch.zeros(1)  # read-only
    weights = idle.held_weights  # the masters and the bf16 copy it samples from, as held
    assert weights.masters is idle.model and set(weights.copies) == {torch.bfloat16}
    with pytest.raises(TypeError):
        weights.copies[torch.float16] = weights.masters  # read-only
    tensors = reference.module.parameters() if reference.module is not None else reference.weights.values()
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    idle.offload_state()
    assert idle.held_reference.parked_bytes == nbytes > 0  # every byte of π_ref, parked while idle
    idle.save_checkpoint(tmp_path / "while_idle")  # a checkpoint of an idle player is whole
    straight.save_checkpoint(tmp_path / "straight")
    for name in ("model.pt", "reference.pt"):
        a, b = (torch.load(tmp_path / d / name, weights_only=True) for d in ("while_idle", "straight"))
        assert all(torch.equal(a[k], b[k]) for k in b), name
    _same_run(straight, idle, straight_metrics, idle_metrics)


def test_after_its_last_block_a_player_frees_its_state_unwritten_and_refuses_to_train(tmp_path):
    """A player with no block left in the run (``offload_state(final=True)``, from ``Team.end_block``) frees its
    optimizer state, π_ref and float32 masters without writing them (its block-end checkpoint holds them; its bf16
    sampling copy stays), and refuses an update, a save or a read of its masters until a checkpoint is loaded."""
    g = torch.Generator().manual_seed(4)
    batch = synthetic_batch(tiny_model()[0], g)
    cfg = trainer_config(dtype="bfloat16", ref_mode="precompute", kl_coef=0.1, offload_dir=str(tmp_path))
    trainer = build_trainer(cfg, tiny_model()[0])
    trainer.sampling_model(torch.bfloat16)
    trainer.start_outer_iteration()
    trainer.update(batch)
    trainer.save_checkpoint(tmp_path / "ckpt")
    trainer.offload_state(final=True)
    assert trainer.optimizer is None and trainer._offloaded_to is None  # nothing written for the optimizer
    assert trainer._reference_parked is not None and trainer._reference_parked._file is None
    assert all(t.numel() == 0 for t in trainer._ref_state.values())
    assert trainer._masters_parked is not None and trainer._masters_parked._file is None
    copy = trainer.sampling_model(torch.bfloat16)
    assert all(p.numel() for p in copy.parameters())  # what co-players sample from stays
    with pytest.raises(RuntimeError, match="last update of the run"):
        trainer.update(batch)
    with pytest.raises(RuntimeError, match="last update of the run"):
        trainer.save_checkpoint(tmp_path / "again")
    with pytest.raises(RuntimeError, match="master weights were freed"):
        trainer.model
    trainer.load_checkpoint(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / "model.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in trainer.model.state_dict().items())  # masters back whole
    assert trainer.update(batch)["actor/kl"] > 0  # trains again, π_ref back from the checkpoint


def test_a_team_frees_a_player_unwritten_only_after_its_last_block(tmp_path):
    team = _team("precompute", tmp_path)
    batch = synthetic_batch(team.players["planning"].model, torch.Generator().manual_seed(0))
    team.start_iteration()
    team.start_block("planning")
    team.update("planning", 1, batch, on_policy=True)
    team.end_block("planning", {"execution", "planning"})  # a later block: its state is written
    assert team.players["planning"].trainer._offloaded_to is not None
    team.start_block("planning")
    team.update("planning", 2, batch)
    team.end_block("planning", {"execution"})  # its last block: freed, not written
    assert team.players["planning"].trainer._offloaded_to is None


def test_a_shared_model_keeps_its_state_while_its_other_role_trains_later(tmp_path):
    """Absolute Zero's shared model: Planning's last block is not the trainer's last when Execution trains later."""
    team = _team("precompute", tmp_path, shared_model=True)
    trainer = team.players["planning"].trainer
    assert team.players["execution"].trainer is trainer
    batch = synthetic_batch(team.players["planning"].model, torch.Generator().manual_seed(0))
    team.start_iteration()
    team.start_block("planning")
    team.update("planning", 1, batch, on_policy=True)
    team.end_block("planning", {"execution", "evaluation"})  # Planning's last block; Execution's is still to come
    assert trainer._offloaded_to is not None  # written, not freed
    team.start_block("execution")
    team.update("execution", 1, batch)  # trains on from the state written
    team.end_block("execution", {"evaluation"})  # the shared trainer's last block: freed, not written
    assert trainer._offloaded_to is None


def test_storages_parked_without_contents_come_back_unwritten(tmp_path):
    from unifiedplayers.trainer.offload import ParkedStorages

    t = torch.arange(100_000, dtype=torch.float32)
    parked = ParkedStorages([t], tmp_path, contents=False)
    assert parked._file is None and t.untyped_storage().nbytes() == 0
    parked.restore()
    assert t.untyped_storage().nbytes() == 400_000


@pytest.mark.slow
def test_an_idle_zero3_offload_engine_parks_its_optimizer_and_keeps_its_weights(tmp_path):
    """The paper presets' trainer (ZeRO-3, ZeRO-Offload with DeepSpeed's CPU Adam, π_ref precomputed): idle, its
    engine's host tensors (fp32 master partitions and their gradients, Adam moments, gradient buffers) hold no memory,
    while a forward through its weights (what co-players sample from) is unchanged; back, it trains on bit for bit."""
    g = torch.Generator().manual_seed(5)
    batches = [synthetic_batch(tiny_model()[0], g) for _ in range(2)]
    cfg = trainer_config(backend="deepspeed_zero3", offload_optimizer=True, ref_mode="precompute", kl_coef=0.1,
                         offload_dir=str(tmp_path))
    straight, idle = build_trainer(cfg, tiny_model()[0]), build_trainer(cfg, tiny_model()[0])
    straight_metrics = _updates(straight, batches, idle_between=False)
    idle_metrics = _updates(idle, batches, idle_between=True)
    _same_run(straight, idle, straight_metrics, idle_metrics)

    ids = torch.tensor([batches[0][0].token_ids])
    with torch.no_grad(), idle.gathered_weights():
        before = idle.model(input_ids=ids).logits
    params = list(idle.model.parameters())  # what the player samples from: its weights and their partitions
    weights = {t.untyped_storage().data_ptr() for t in params + [p.ds_tensor for p in params]}
    zero = idle.engine.optimizer
    held_by_optimizer = [t for v in [*vars(zero).values(), list(zero.optimizer.state.values())] for t in _tensors(v)]
    parked = [t for t in held_by_optimizer
              if t.untyped_storage().nbytes() >= 64 * 1024 and t.untyped_storage().data_ptr() not in weights]
    assert sum(t.untyped_storage().nbytes() for t in parked) > 8 * sum(p.ds_numel for p in idle.model.parameters())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in parked}
    assert straight.parked_optimizer_bytes == idle.parked_optimizer_bytes == 0
    idle.offload_state()
    assert not idle.has_optimizer_state
    assert all(t.untyped_storage().nbytes() == 0 for t in parked)  # master, moments, gradients: none in memory
    assert idle.parked_optimizer_bytes >= sum(storages.values())  # what the paper unit of the GPU check reports as parked
    assert all(t.numel() == 0 for t in idle.held_reference.weights.values())
    with torch.no_grad(), idle.gathered_weights():
        assert torch.equal(idle.model(input_ids=ids).logits, before)
    metrics = (straight.update(batches[0]), idle.update(batches[0]))
    _same_run(straight, idle, [metrics[0]], [metrics[1]])
    assert idle.parked_optimizer_bytes == 0  # brought back
