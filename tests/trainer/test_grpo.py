"""Hand-worked checks of the GRPO maths (Eqs. 17–21, Appendix B.3)."""
from __future__ import annotations

import math

import pytest
import torch

from unifiedplayers.trainer import grpo

pytestmark = pytest.mark.cpu


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors: one thread avoids OpenMP start-up and contention on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _loss(logprobs, old, adv, mask, groups, **kw):
    kw.setdefault("clip_eps", 0.2)
    kw.setdefault("kl_coef", 0.0)
    return grpo.policy_loss(logprobs, old, kw.pop("ref", None), adv, mask, groups, **kw)


# ---------------------------------------------------------------- Eq. 17
def test_group_advantages_population_std_by_hand():
    # Group 0: rewards 0, 1, 2 -> mean 1, population var (1 + 0 + 1)/3 = 2/3, std 0.81650
    #   -> Â = (-1, 0, 1) / 0.81650 = (-1.22474, 0, 1.22474).
    # Group 7: rewards 1, 0, 0, 1 -> mean 0.5, std 0.5 -> Â = (1, -1, -1, 1).
    rewards = torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 7, 7, 7, 7])
    adv = grpo.group_advantages(rewards, groups, eps=0.0)
    expected = torch.tensor([-1.224745, 0.0, 1.224745, 1.0, -1.0, -1.0, 1.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    # Sample std (n - 1): group 0 std = 1 -> Â = (-1, 0, 1).
    adv_s = grpo.group_advantages(rewards[:3], groups[:3], eps=0.0, unbiased=True)
    torch.testing.assert_close(adv_s, torch.tensor([-1.0, 0.0, 1.0]))


def test_equal_rewards_give_exactly_zero_advantages_and_singletons_are_finite():
    rewards = torch.tensor([0.3, 0.3, 0.3, 5.0])
    groups = torch.tensor([1, 1, 1, 2])  # group 2 has one member: population std 0, not NaN
    adv = grpo.group_advantages(rewards, groups)
    assert torch.equal(adv, torch.zeros(4))


def test_equal_rewards_give_zero_policy_gradient():
    torch.manual_seed(0)
    rewards = torch.full((4,), 0.7)
    groups = torch.tensor([0, 0, 1, 1])
    adv = grpo.group_advantages(rewards, groups)
    old = torch.randn(4, 5)
    logprobs = (old + 0.3 * torch.randn(4, 5)).requires_grad_()  # ratio != 1, still no signal
    loss, _ = _loss(logprobs, old, adv, torch.ones(4, 5), groups)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(logprobs.grad) == 0


def test_no_std_variant_is_registered():
    adv = grpo.get_adv_estimator("grpo_no_std")(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]))


# ---------------------------------------------------------------- Eqs. 18, 19
def test_ratio_is_one_at_first_step_and_gradient_is_weighted_advantage():
    # Policy == behaviour policy: ϱ = 1 everywhere, nothing clipped, surrogate = Â.
    # Two groups of two candidates with Â = (+1, -1 | +2, -2) and 2 trainable tokens each; Eq. 21 weight
    # of each token = 1 / (2 tokens * 2 candidates * 2 groups) = 1/8. Loss = -Σ w Â = 0 (each group
    # averages to 0); d loss / d logprob_t = -w Â ϱ = -Â/8.
    old = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9], [0.3, 0.3], [0.6, 0.2]]))
    logprobs = old.clone().requires_grad_()
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])
    groups = torch.tensor([0, 0, 1, 1])
    loss, m = _loss(logprobs, old, adv, torch.ones(4, 2), groups)
    loss.backward()
    assert m["actor/ratio_mean"] == 1.0 and m["actor/ratio_min"] == 1.0 and m["actor/ratio_max"] == 1.0
    assert m["actor/pg_clip_frac"] == 0.0 and m["actor/clip_frac"] == 0.0
    assert abs(loss.item()) < 1e-7
    torch.testing.assert_close(logprobs.grad, -adv[:, None].expand(4, 2) / 8)


def test_positive_advantage_beyond_upper_clip_has_no_gradient():
    # ε = 0.2. Token 0: ϱ = 1.5 > 1.2 with Â = +1 -> min(1.5, 1.2) = 1.2, clipped, zero gradient.
    # Token 1: ϱ = 0.5 with Â = +1 -> min(0.5, 0.8) = 0.5, unclipped, gradient -w·ϱ·Â = -0.5/2 = -0.25.
    # One candidate, one group: w = 1/2. Loss = -(1.2 + 0.5)/2 = -0.85.
    old = torch.log(torch.tensor([[0.2, 0.4]]))
    logprobs = (old + torch.log(torch.tensor([[1.5, 0.5]]))).requires_grad_()
    loss, m = _loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2), torch.tensor([0]))
    loss.backward()
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    assert logprobs.grad[0, 0] == 0.0
    assert float(logprobs.grad[0, 1]) == pytest.approx(-0.25, abs=1e-6)
    assert m["actor/pg_clip_frac"] == 0.5  # only token 0 is on the clipped branch
    assert m["actor/clip_frac"] == 1.0  # both ratios lie outside [0.8, 1.2]
    assert m["actor/ratio_max"] == pytest.approx(1.5, abs=1e-6)
    assert m["actor/ratio_min"] == pytest.approx(0.5, abs=1e-6)


def test_negative_advantage_beyond_upper_clip_keeps_gradient():
    # Â = -1, ϱ = 1.5: min(-1.5, -1.2) = -1.5 (unclipped) -> gradient -w·ϱ·Â = +1.5 with w = 1.
    old = torch.log(torch.tensor([[0.2]]))
    logprobs = (old + math.log(1.5)).requires_grad_()
    loss, m = _loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 1), torch.tensor([0]))
    loss.backward()
    assert loss.item() == pytest.approx(1.5, abs=1e-6)
    assert float(logprobs.grad[0, 0]) == pytest.approx(1.5, abs=1e-6)
    assert m["actor/pg_clip_frac"] == 0.0


def test_masked_tokens_get_zero_gradient_even_with_kl():
    torch.manual_seed(1)
    old = torch.randn(3, 6)
    ref = torch.randn(3, 6)
    logprobs = torch.randn(3, 6).requires_grad_()
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1]])
    loss, m = _loss(logprobs, old, torch.tensor([1.0, -0.5, 0.2]), mask, torch.tensor([0, 0, 1]),
                    kl_coef=0.1, ref=ref)
    loss.backward()
    assert torch.count_nonzero(logprobs.grad[mask == 0]) == 0
    assert torch.count_nonzero(logprobs.grad[mask == 1]) == int(mask.sum())
    assert m["actor/num_tokens"] == 13.0


# ---------------------------------------------------------------- Eq. 20
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_is_zero_when_policy_equals_reference(name):
    lp = torch.log(torch.tensor([[0.1, 0.7, 0.2]]))
    assert torch.equal(grpo.get_kl_estimator(name)(lp, lp.clone()), torch.zeros(1, 3))
    loss, m = _loss(lp, lp.clone(), torch.zeros(1), torch.ones(1, 3), torch.tensor([0]),
                    kl_coef=0.04, kl_estimator=name, ref=lp.clone())
    assert m["actor/kl"] == 0.0 and loss.item() == 0.0


def test_kl_estimators_by_hand():
    # π_θ = 0.5, π_ref = 0.25: log-ratio log(π_ref/π_θ) = -log 2.
    # k1 = log 2 = 0.693147; k2 = ½ (log 2)² = 0.240227; k3 = 0.5 + log 2 − 1 = 0.193147.
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert float(grpo.kl_k1(lp, ref)) == pytest.approx(0.693147, abs=1e-6)
    assert float(grpo.kl_k2(lp, ref)) == pytest.approx(0.240227, abs=1e-6)
    assert float(grpo.kl_k3(lp, ref)) == pytest.approx(0.193147, abs=1e-6)
    # In the loss: Â = 0 so the loss is β·k3 = 0.04 · 0.193147 = 0.0077259.
    loss, m = _loss(lp[None], lp[None].clone(), torch.zeros(1), torch.ones(1, 1), torch.tensor([0]),
                    kl_coef=0.04, ref=ref[None])
    assert loss.item() == pytest.approx(0.04 * 0.193147, abs=1e-7)
    assert m["actor/kl"] == pytest.approx(0.193147, abs=1e-6)


def test_kl_needs_reference_when_coefficient_nonzero():
    with pytest.raises(ValueError, match="ref_logprobs"):
        _loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), torch.tensor([0]),
              kl_coef=0.1)


# ---------------------------------------------------------------- Eq. 21
def _aggregation_example():
    # Group 0: candidate a (1 token, Â = 3) and candidate b (3 tokens, Â = -1); group 1: candidate c
    # (2 tokens, Â = 2). ϱ = 1 so each token's objective is its candidate's Â.
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([3.0, -1.0, 2.0])
    groups = torch.tensor([0, 0, 1])
    return torch.zeros(3, 3), mask, adv, groups


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        # Eq. 21: group 0 = (3 + (-1))/2 = 1, group 1 = 2, batch = (1 + 2)/2 = 1.5 -> loss -1.5
        ("seq_group_mean", -1.5),
        # token mean: (3·1 - 1·3 + 2·2) / 6 tokens = 4/6 -> loss -0.666667
        ("token_mean", -4.0 / 6.0),
        # sequence mean: (3 - 1 + 2)/3 = 4/3 -> loss -1.333333
        ("seq_mean", -4.0 / 3.0),
    ],
)
def test_aggregation_modes_by_hand(aggregation, expected):
    lp, mask, adv, groups = _aggregation_example()
    loss, _ = _loss(lp, lp.clone(), adv, mask, groups, aggregation=aggregation)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_eq21_weights_by_hand_and_sum_to_one():
    _, mask, _, groups = _aggregation_example()
    w = grpo.aggregation_weights(mask, groups, "seq_group_mean")
    # a: 1/(1·2·2) = 1/4, b: 1/(3·2·2) = 1/12, c: 1/(2·1·2) = 1/4
    torch.testing.assert_close(w, torch.tensor([0.25, 1 / 12, 0.25]))
    assert float((w[:, None] * mask).sum()) == pytest.approx(1.0)


def test_all_masked_candidate_is_left_out_of_its_group():
    # Candidate b has no trainable token: group 0 averages over a alone -> a gets 1/(1·1·2).
    mask = torch.tensor([[1, 0], [0, 0], [1, 1]])
    w = grpo.aggregation_weights(mask, torch.tensor([0, 0, 1]))
    torch.testing.assert_close(w, torch.tensor([0.5, 0.0, 0.25]))


def test_micro_batches_with_global_weights_sum_to_full_batch_loss_and_gradient():
    torch.manual_seed(2)
    n, t = 6, 5
    old = torch.randn(n, t)
    ref = torch.randn(n, t)
    logprobs = (old + 0.3 * torch.randn(n, t)).requires_grad_()
    mask = (torch.rand(n, t) > 0.3).long()
    mask[:, 0] = 1
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    adv = grpo.group_advantages(torch.randn(n), groups)
    kw = dict(clip_eps=0.2, kl_coef=0.05)
    full, _ = grpo.policy_loss(logprobs, old, ref, adv, mask, groups, **kw)
    (g_full,) = torch.autograd.grad(full, logprobs)
    w = grpo.aggregation_weights(mask, groups)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, _ = grpo.policy_loss(logprobs[sl], old[sl], ref[sl], adv[sl], mask[sl], groups[sl],
                                   sample_weights=w[sl], **kw)
        total = total + part
    (g_micro,) = torch.autograd.grad(total, logprobs)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_micro, g_full)


# ---------------------------------------------------------------- metrics and registry
def test_entropy_metric_is_the_mean_over_trained_tokens():
    lp = torch.full((2, 3), math.log(0.25))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    _, m = _loss(lp, lp.clone(), torch.zeros(2), mask, torch.tensor([0, 0]),
                 entropy=torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]))
    assert m["actor/entropy"] == pytest.approx(2.0)


def test_registry_rejects_unknown_names_and_accepts_new_entries():
    with pytest.raises(KeyError, match="k3"):
        grpo.get_kl_estimator("k4")
    with pytest.raises(KeyError, match="seq_group_mean"):
        grpo.aggregation_weights(torch.ones(1, 1), torch.zeros(1), "nope")

    @grpo.register_aggregation("test_first_token_only")
    def _first(token_counts, group_index):
        return torch.ones_like(token_counts, dtype=torch.float32)

    try:
        assert grpo.get_aggregation("test_first_token_only") is _first
        with pytest.raises(ValueError, match="already registered"):
            grpo.register_aggregation("test_first_token_only")(lambda c, g: c)
    finally:
        del grpo.AGGREGATIONS["test_first_token_only"]
