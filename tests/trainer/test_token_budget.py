"""Token-budget micro-batches (``trainer.max_tokens_per_micro_batch``; verl's dynamic batch size): the split worked
by hand, the loss, gradient and π_old equal to the fixed-count split's and to autograd on the unsplit batch (Eq. 21's
weights come from the whole batch), ``perf/pad_share``, the ranks' shares, and bad budgets refused."""
from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from unifiedplayers.config import compose
from unifiedplayers.trainer import build_trainer
from unifiedplayers.trainer import batching
from unifiedplayers.trainer.batching import micro_batch_members, pad_share, plan_micro_batches

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

LENGTHS = [5, 9, 3, 9, 4, 7]


def test_split_and_pad_share_by_hand():
    cfg = trainer_config(micro_batch_size=2, max_tokens_per_micro_batch=20)
    # longest first, ties in batch order: 1 (9), 3 (9), 5 (7), 0 (5), 4 (4), 2 (3); 2 x 9 = 18 <= 20, 3 x 9 = 27 > 20;
    # 2 x 7 = 14, 3 x 7 = 21 > 20; 2 x 4 = 8
    assert micro_batch_members(LENGTHS, cfg) == [[1, 3], [5, 0], [4, 2]]
    # processed 18 + 14 + 8 = 40 positions for 37 tokens
    assert pad_share(LENGTHS, [[1, 3], [5, 0], [4, 2]]) == pytest.approx(3 / 40, abs=1e-15)
    fixed = micro_batch_members(LENGTHS, trainer_config(micro_batch_size=2))
    assert fixed == [[0, 1], [2, 3], [4, 5]]
    assert pad_share(LENGTHS, fixed) == pytest.approx(1 - 37 / 50, abs=1e-15)  # 18 + 18 + 14 = 50
    # a budget met exactly still fills: 2 x 9 = 18, then 3 x 7 = 21 > 18 and 2 x 7 = 14; 2 x 4 = 8
    assert micro_batch_members(LENGTHS, trainer_config(max_tokens_per_micro_batch=18)) == [[1, 3], [5, 0], [4, 2]]
    assert micro_batch_members(LENGTHS, trainer_config(max_tokens_per_micro_batch=17)) == [[1], [3], [5, 0], [4, 2]]
    assert micro_batch_members(LENGTHS, trainer_config(micro_batch_size=2, max_tokens_per_micro_batch=1000)) == [
        [1, 3, 5, 0, 4, 2]]


def test_a_sample_over_the_budget_is_alone_with_one_warning(monkeypatch):
    monkeypatch.setattr(batching, "_warned_over_budget", set())
    cfg = trainer_config(max_tokens_per_micro_batch=8)
    with pytest.warns(UserWarning, match=r"trainer\.max_tokens_per_micro_batch=8 is below the longest sample \(12 tokens\)"):
        assert micro_batch_members([10, 3, 2, 12], cfg) == [[3], [0], [1, 2]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per budget
        assert micro_batch_members([10, 3], cfg) == [[0], [1]]


def _batch(seed: int = 3, n: int = 12):
    model, _ = tiny_model()
    return synthetic_batch(model, torch.Generator().manual_seed(seed), n=n, group_size=4)


def _update(batch, **cfg):
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(**cfg), model)
    trainer.start_outer_iteration()
    return trainer.update([s for s in batch]), model


def _loss_scale(batch) -> float:
    """Σ_i w_i |A_i| (Eq. 21's weights): the policy loss at ratio 1 without the advantages' cancellation. The loss
    itself is a small difference of such terms (-0.0032 of a scale of 0.17 here), so its float32 rounding is
    judged relative to this scale."""
    from unifiedplayers.trainer import grpo

    counts = torch.tensor([sum(s.loss_mask) for s in batch])
    weights = grpo.get_aggregation("seq_group_mean")(counts, torch.tensor([s.group for s in batch]))
    return float((weights * torch.tensor([abs(s.advantage) for s in batch])).sum())


def test_update_equals_the_fixed_count_split_and_reports_the_pad_share():
    batch = _batch()
    lengths = [len(s.token_ids) for s in batch]
    assert len(set(lengths)) > 3  # mixed lengths
    whole, _ = _update(batch, micro_batch_size=len(batch))
    fixed, fixed_model = _update(batch, micro_batch_size=3)
    budget, budget_model = _update(batch, micro_batch_size=3, max_tokens_per_micro_batch=3 * max(lengths) - 1)
    assert budget["actor/num_micro_batches"] > 1
    scale = _loss_scale(batch)
    for other in (fixed, whole):
        assert abs(budget["actor/loss"] - other["actor/loss"]) <= 1e-6 * scale
        assert budget["actor/grad_norm"] == pytest.approx(other["actor/grad_norm"], rel=1e-6)
    members = micro_batch_members(lengths, trainer_config(max_tokens_per_micro_batch=3 * max(lengths) - 1))
    assert budget["perf/pad_share"] == pytest.approx(pad_share(lengths, members), abs=1e-15)
    assert budget["perf/pad_share"] < fixed["perf/pad_share"]
    for (name, p), q in zip(fixed_model.named_parameters(), budget_model.parameters()):
        torch.testing.assert_close(q, p, atol=2e-6, rtol=0, msg=name)


def _gradients(batch, **cfg) -> dict[str, torch.Tensor]:
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(kl_coef=0.0, **cfg), model)
    plan = plan_micro_batches(batch, trainer.cfg, rank=0, world_size=1, lockstep=False, device=trainer.device,
                              pad_id=trainer.pad_token_id)
    trainer._accumulate_gradients(plan, [None] * len(plan.micro), {})
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_gradient_equals_autograd_on_the_unsplit_batch():
    batch = _batch(seed=5)
    whole = _gradients(batch, micro_batch_size=len(batch))  # one micro-batch: autograd over the whole batch
    split = _gradients(batch, micro_batch_size=3, max_tokens_per_micro_batch=2 * max(len(s.token_ids) for s in batch))
    assert whole.keys() == split.keys() and whole
    for name, g in whole.items():
        torch.testing.assert_close(split[name], g, rtol=1e-5, atol=1e-7, msg=name)
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in whole.values()))
    diff = torch.sqrt(sum(((split[k] - g).double() ** 2).sum() for k, g in whole.items()))
    assert float(diff / total) < 1e-6


def test_old_logprobs_recomputed_under_a_budget_go_back_to_their_own_samples():
    batch_a, batch_b = _batch(seed=9), _batch(seed=9)
    budget = 2 * max(len(s.token_ids) for s in batch_a)
    for batch, cfg in ((batch_a, {}), (batch_b, {"max_tokens_per_micro_batch": budget})):
        model, _ = tiny_model()
        build_trainer(trainer_config(micro_batch_size=3, **cfg), model).recompute_old_logprobs(batch)
    for a, b in zip(batch_a, batch_b):
        assert len(b.old_logprobs) == len(b.token_ids)
        torch.testing.assert_close(torch.as_tensor(b.old_logprobs), torch.as_tensor(a.old_logprobs), atol=1e-6,
                                   rtol=0)


@pytest.mark.parametrize("world", [2, 3, 16])
def test_ranks_share_every_sample_once_balanced_by_tokens_and_run_as_many_passes(world):
    batch = _batch(n=8)
    lengths = [len(s.token_ids) for s in batch]
    cfg = trainer_config(max_tokens_per_micro_batch=2 * max(lengths))
    plans = [plan_micro_batches(batch, cfg, rank=r, world_size=world, lockstep=True, device=torch.device("cpu"),
                                pad_id=0) for r in range(world)]
    per_rank = plans[0].per_rank
    assert sorted(i for share in per_rank for m in share for i in m) == list(range(len(batch)))
    assert sum(p.real for p in plans) == plans[0].num_micro == sum(len(share) for share in per_rank)
    assert [p.real for p in plans] == [len(share) for share in per_rank]
    assert len({len(p.micro) for p in plans}) == 1  # lockstep: as many forwards and backwards on every rank
    for p in plans:
        for mb in p.micro[p.real:]:
            assert float(mb.weights.abs().sum()) == 0.0
    tokens = sorted(sum(lengths[i] for m in share for i in m) for share in per_rank)
    if world <= len(batch):  # longest first to the emptiest rank: no rank idle, none above another by a sample
        assert tokens[0] > 0 and tokens[-1] - tokens[0] <= max(lengths)
    else:
        assert tokens.count(0) == world - len(batch)
    fixed = [plan_micro_batches(batch, trainer_config(micro_batch_size=3), rank=r, world_size=world, lockstep=False,
                                device=torch.device("cpu"), pad_id=0).per_rank[r] for r in range(world)]
    assert fixed[0][0] == [0, 1, 2] and fixed[1] == [[3, 4, 5]]  # micro-batch i on rank i mod N


@pytest.mark.parametrize("value, message", [
    (0, r"trainer\.max_tokens_per_micro_batch=0: need > 0"),
    (-5, r"trainer\.max_tokens_per_micro_batch=-5: need > 0"),
])
def test_a_budget_of_zero_or_less_is_refused_at_start_up(value, message):
    from unifiedplayers.checks import check_ranges

    cfg = compose(["experiment=tiny", f"trainer.max_tokens_per_micro_batch={value}"])
    with pytest.raises(ValueError, match=message):
        check_ranges(cfg)
    cfg = compose(["experiment=tiny", "trainer.max_tokens_per_micro_batch=64", "trainer.grad_accum_steps=2"])
    with pytest.raises(ValueError, match="both split the batch"):
        check_ranges(cfg)
    check_ranges(compose(["experiment=tiny", "trainer.max_tokens_per_micro_batch=64"]))
    assert OmegaConf.select(compose(["experiment=tiny"]), "trainer.max_tokens_per_micro_batch") is None
