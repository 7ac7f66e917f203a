"""GRPO for one player (§3.3, Appendix B.3): pure torch maths, no model, no optimizer.

Equation numbers follow the paper's Appendix B.3:

- Eq. 17  group-relative advantage  Â_g = (r_g − mean(r)) / (std(r) + ε)         -> :func:`group_advantages`
- Eq. 18  token ratio               ϱ_t = π_θ(o_t | ·) / π_old(o_t | ·)             -> :func:`policy_loss`
- Eq. 19  clipped surrogate         min(ϱ_t Â, clip(ϱ_t, 1 − ε, 1 + ε) Â)           -> :func:`clipped_surrogate`
- Eq. 20  KL penalty                β_p · KL(π_θ ‖ π_ref), per-token estimator k1/k2/k3 -> :data:`KL_ESTIMATORS`
- Eq. 21  aggregation               tokens within a candidate, candidates within a group, groups
                                    over the batch                                   -> :func:`seq_group_mean_weights`

Everything is registered by name, verl style (``@register_policy_loss("my_loss")``). Aggregations are *per-sample
token weights* summing to 1 over the whole batch (:func:`aggregation_weights`), so the micro-batches' losses, each
with its slice (``sample_weights=``), add up to the batch's loss. π_old and π_ref enter as fixed tensors.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from unifiedplayers.registry import Registry

Tensor = torch.Tensor

# One Registry per kind: a second, different function under a taken name is refused; a miss names the known ones.
ADV_ESTIMATORS = Registry("advantage estimator", "trainer.adv_estimator")
POLICY_LOSSES = Registry("policy loss", "trainer.policy_loss")
KL_ESTIMATORS = Registry("KL estimator", "trainer.kl_estimator")
AGGREGATIONS = Registry("aggregation", "trainer.aggregation")


def register_adv_est(name: str):
    """Register ``fn(rewards (N,), group_index (N,), **kw) -> advantages (N,)`` under ``name``."""
    return ADV_ESTIMATORS.register(name)


def register_policy_loss(name: str):
    """Register ``fn(logprobs, old_logprobs, ref_logprobs, advantages, mask, group_index, **kw)``."""
    return POLICY_LOSSES.register(name)


def register_kl_estimator(name: str):
    """Register ``fn(logprobs (N,T), ref_logprobs (N,T)) -> per-token KL(π_θ‖π_ref) estimate (N,T)``."""
    return KL_ESTIMATORS.register(name)


def register_aggregation(name: str):
    """Register ``fn(token_counts (N,), group_index (N,)) -> per-token weight of each sample (N,)``."""
    return AGGREGATIONS.register(name)


get_adv_estimator: Callable[[str], Callable[..., Tensor]] = ADV_ESTIMATORS.get
get_policy_loss: Callable[[str], Callable[..., tuple[Tensor, dict[str, float]]]] = POLICY_LOSSES.get
get_kl_estimator: Callable[[str], Callable[[Tensor, Tensor], Tensor]] = KL_ESTIMATORS.get
get_aggregation: Callable[[str], Callable[[Tensor, Tensor], Tensor]] = AGGREGATIONS.get


# Eq. 17: advantages
def _group_ids(group_index: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group labels (N,) to dense ids 0..G-1; returns (ids (N,), G)."""
    _, dense = torch.unique(group_index, return_inverse=True)
    return dense, int(dense.max().item()) + 1 if dense.numel() else 0


def _group_mean(values: Tensor, dense: Tensor, num_groups: int) -> Tensor:
    """Per-group mean of ``values`` (N,) -> (G,)."""
    return _group_sum(values, dense, num_groups) / _group_sum(torch.ones_like(values), dense, num_groups)


def _group_sum(values: Tensor, dense: Tensor, num_groups: int) -> Tensor:
    """Per-group sum of ``values`` (N,) -> (G,)."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, dense, values)


@register_adv_est("grpo")
def group_advantages(rewards: Tensor, group_index: Tensor, eps: float = 1e-6, unbiased: bool = False) -> Tensor:
    """Eq. 17: Â_g = (r_g − mean_{g' ∈ G(g)} r_g') / (std_{g' ∈ G(g)} r_g' + ε).

    ``rewards`` (N,) of the candidates, ``group_index`` (N,) their group labels (any integers) -> (N,) advantages,
    float32 (float64 for float64 rewards). The std is the *population* std (the paper's s_p describes the group
    itself; defined for a group of one), unless ``unbiased``. Equal rewards give exactly zero advantages.
    """
    rewards = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    dense, num_groups = _group_ids(group_index)
    mean = _group_mean(rewards, dense, num_groups)
    centred = rewards - mean[dense]
    var = _group_mean(centred**2, dense, num_groups)
    if unbiased:
        count = _group_sum(torch.ones_like(rewards), dense, num_groups)
        var = var * count / (count - 1).clamp(min=1)
    return centred / (var.sqrt()[dense] + eps)


@register_adv_est("grpo_no_std")
def group_centred_rewards(rewards: Tensor, group_index: Tensor, eps: float = 1e-6) -> Tensor:
    """Eq. 17 without the std division (the Dr. GRPO variant); an ablation option, not the paper's default."""
    rewards = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    dense, num_groups = _group_ids(group_index)
    return rewards - _group_mean(rewards, dense, num_groups)[dense]


# Eq. 20: per-token KL(π_θ ‖ π_ref) estimators (Schulman's k1, k2, k3), evaluated at tokens o_t ~ π_old
_KL_LOG_RATIO_CLAMP = 20.0  # keeps exp() finite when a token's log-ratio explodes early in training


@register_kl_estimator("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log π_θ − log π_ref (unbiased, can be negative per token)."""
    return logprobs - ref_logprobs


@register_kl_estimator("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ½ (log π_θ − log π_ref)² (biased, low variance, ≥ 0)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@register_kl_estimator("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 (unbiased, ≥ 0; the GRPO default)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-_KL_LOG_RATIO_CLAMP, _KL_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - log_ratio - 1.0


# Eq. 21: aggregation as per-sample token weights summing to 1 over the batch
@register_aggregation("seq_group_mean")
def seq_group_mean_weights(token_counts: Tensor, group_index: Tensor) -> Tensor:
    """Eq. 21: tokens averaged within a candidate, candidates within a group, groups over the batch.

    A token of candidate n (|o_n| trainable tokens of ``token_counts`` (N,), group g of ``group_index`` (N,) with |g|
    candidates, B groups) gets weight 1 / (|o_n| · |g| · B) -> (N,). Candidates with no trainable token are left out of
    their group's count, and groups left empty out of B: an all-masked sample neither adds loss nor dilutes others.
    """
    counts = token_counts.to(torch.float64)
    valid = counts > 0
    dense, num_groups = _group_ids(group_index)
    per_group = _group_sum(valid.to(torch.float64), dense, num_groups)
    num_nonempty_groups = (per_group > 0).sum().clamp(min=1)
    weights = 1.0 / (counts.clamp(min=1) * per_group[dense].clamp(min=1) * num_nonempty_groups)
    return torch.where(valid, weights, torch.zeros_like(weights)).to(torch.float32)


@register_aggregation("seq_mean")
def seq_mean_weights(token_counts: Tensor, group_index: Tensor) -> Tensor:
    """Tokens averaged within a candidate, then candidates over the batch (groups ignored)."""
    counts = token_counts.to(torch.float64)
    valid = counts > 0
    weights = 1.0 / (counts.clamp(min=1) * valid.sum().clamp(min=1))
    return torch.where(valid, weights, torch.zeros_like(weights)).to(torch.float32)


@register_aggregation("token_mean")
def token_mean_weights(token_counts: Tensor, group_index: Tensor) -> Tensor:
    """Every trainable token of the batch weighs the same: 1 / Σ_n |o_n| (DAPO-style token mean)."""
    counts = token_counts.to(torch.float64)
    return (torch.ones_like(counts) / counts.sum().clamp(min=1)).to(torch.float32)


def aggregation_weights(mask: Tensor, group_index: Tensor, aggregation: str = "seq_group_mean") -> Tensor:
    """Per-sample token weights (N,) for ``mask`` (N, T) under the named aggregation (Eq. 21 by default)."""
    return get_aggregation(aggregation)(mask.sum(dim=-1), group_index)


# Eqs. 18–19: ratio and clipped surrogate
def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_eps: float,
                      clip_high: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Eq. 19: min(ϱ Â, clip(ϱ, 1 − ε, 1 + ε) Â) per token, from ``ratio`` ϱ (N, T) and ``advantages`` Â (N, 1) or
    (N, T). ``clip_high``: optional (N,) upper ε of each sample, clip [1 − ε, 1 + ε_high[n]] (Agent0's ADPO).
    Returns (surrogate (N, T), clipped_active (N, T): the clipped branch is the strict minimum, no policy gradient).
    """
    unclipped = ratio * advantages
    if clip_high is None:
        clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    else:
        upper = 1.0 + clip_high.to(ratio.dtype)[:, None]
        clipped = torch.minimum(ratio.clamp(min=1.0 - clip_eps), upper) * advantages
    return torch.minimum(unclipped, clipped), clipped < unclipped


@register_policy_loss("grpo_clip")
def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    group_index: Tensor,
    clip_eps: float,
    kl_coef: float,
    kl_estimator: str = "k3",
    aggregation: str = "seq_group_mean",
    sample_weights: Optional[Tensor] = None,
    entropy: Optional[Tensor] = None,
    clip_high: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, float]]:
    """The GRPO loss of one player (Eqs. 18–21), to minimise: ℓ_t = min(ϱ_t Â, clip(ϱ_t, 1 − ε, 1 + ε) Â) − β_p ·
    KL_t(π_θ ‖ π_ref) (Eqs. 19, 20), ϱ_t = exp(log π_θ − log π_old) (Eq. 18); loss = −Σ_{n,t} w_n · mask_{n,t} · ℓ_{n,t}
    with the Eq. 21 weights w_n.

    ``logprobs`` (N, T) log π_θ (with gradient), ``old_logprobs`` (N, T) π_old's, ``ref_logprobs`` (N, T) π_ref's (None
    when β = 0), ``advantages`` (N,), ``mask`` (N, T) 1 on trainable completion tokens, ``group_index`` (N,).
    ``sample_weights`` (N,): the slice of the whole batch's :func:`aggregation_weights` (else ``aggregation`` names
    them); ``entropy`` (N, T): token entropy, for its metric only; ``clip_high`` (N,): Eq. 19's
    per-sample ε_high, NaN for ``clip_eps``. Returns (loss, metrics with ``actor/`` keys: token statistics are means
    over trainable tokens; ``actor/num_tokens`` lets a caller combine micro-batches).
    """
    maskf = mask.to(logprobs.dtype)
    valid = mask.bool()
    if sample_weights is None:
        sample_weights = aggregation_weights(mask, group_index, aggregation)
    token_weights = sample_weights.to(logprobs.dtype)[:, None] * maskf  # Σ over the batch = 1

    log_ratio = logprobs - old_logprobs.to(logprobs.dtype)  # Eq. 18
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype)[:, None]
    clip_high = _resolve_clip_high(clip_high, clip_eps, logprobs.device)
    surrogate, clipped_active = clipped_surrogate(ratio, adv, clip_eps, clip_high)  # Eq. 19

    pg_loss = -(token_weights * surrogate).sum()
    loss, kl = _kl_penalty(pg_loss, logprobs, ref_logprobs, token_weights, kl_coef, kl_estimator)  # Eq. 20

    with torch.no_grad():
        metrics = _clip_metrics(loss, pg_loss, ratio, clipped_active, valid, clip_eps, clip_high)
        denom = max(int(metrics["actor/num_tokens"]), 1)
        if kl is not None:
            metrics["actor/kl"] = float((kl.detach() * maskf).sum()) / denom
        if entropy is not None:
            metrics["actor/entropy"] = float((entropy.detach().float() * maskf).sum()) / denom
    return loss, metrics


def _resolve_clip_high(clip_high: Optional[Tensor], clip_eps: float, device: torch.device) -> Optional[Tensor]:
    """Per-sample upper clip ε_high (N,) of Eq. 19, float32 on ``device``, NaN entries as ``clip_eps``; None stays None."""
    if clip_high is None:
        return None
    clip_high = clip_high.to(device, torch.float32)
    return torch.where(torch.isnan(clip_high), torch.full_like(clip_high, clip_eps), clip_high)


def _kl_penalty(pg_loss: Tensor, logprobs: Tensor, ref_logprobs: Optional[Tensor], token_weights: Tensor,
                kl_coef: float, kl_estimator: str) -> tuple[Tensor, Optional[Tensor]]:
    """Eq. 20: loss = pg_loss + β_p · Σ w · KL_t(π_θ ‖ π_ref); returns (loss, per-token KL or None). β_p = 0: no
    penalty, the KL measured without gradient if ``ref_logprobs`` is given."""
    if kl_coef != 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef != 0 needs ref_logprobs")
        kl = get_kl_estimator(kl_estimator)(logprobs, ref_logprobs.to(logprobs.dtype))
        kl_loss = (token_weights * kl).sum()
        return pg_loss + kl_coef * kl_loss, kl
    if ref_logprobs is not None:
        return pg_loss, get_kl_estimator(kl_estimator)(logprobs.detach(), ref_logprobs.to(logprobs.dtype))
    return pg_loss, None


def _clip_metrics(loss: Tensor, pg_loss: Tensor, ratio: Tensor, clipped_active: Tensor, valid: Tensor,
                  clip_eps: float, clip_high: Optional[Tensor]) -> dict[str, float]:
    """Loss, Eq. 18 ratio and Eq. 19 clip statistics over the trainable tokens (``valid``); call under
    ``torch.no_grad()``."""
    n_tok = int(valid.sum().item())
    denom = max(n_tok, 1)
    r = ratio.detach()[valid]
    upper = 1.0 + (clip_eps if clip_high is None else clip_high[:, None].expand_as(ratio)[valid])
    outside = (r < 1.0 - clip_eps) | (r > upper)
    return {
        "actor/loss": float(loss.detach()),
        "actor/pg_loss": float(pg_loss.detach()),
        "actor/pg_clip_frac": float(clipped_active[valid].sum()) / denom,  # tokens on the clipped branch of Eq. 19
        "actor/clip_frac": float(outside.sum()) / denom,  # tokens whose ratio lies outside the clip range
        "actor/ratio_mean": float(r.mean()) if n_tok else 1.0,
        "actor/ratio_min": float(r.min()) if n_tok else 1.0,
        "actor/ratio_max": float(r.max()) if n_tok else 1.0,
        "actor/num_tokens": float(n_tok),
    }


# Preference and imitation losses (Socratic-Zero's Solver and Generator; methods/socratic_zero.py)
@register_policy_loss("dpo")
def dpo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Optional[Tensor], advantages: Tensor, mask: Tensor,
             group_index: Tensor, clip_eps: float, kl_coef: float, sample_weights: Optional[Tensor] = None,
             aggregation: str = "seq_group_mean", **_: object) -> tuple[Tensor, dict[str, float]]:
    """DPO (Rafailov et al. 2023), the Solver's loss in Socratic-Zero: per preference pair (y_w, y_l),
    −log σ(β [(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))]), sequence log-probs summed
    over the trainable tokens; β = ``kl_coef``. A pair is a group of two samples in one micro-batch, ``advantages``
    +1 the chosen, −1 the rejected; it weighs what its samples weigh under ``sample_weights`` (1/#pairs)."""
    if kl_coef <= 0.0 or ref_logprobs is None:
        raise ValueError("dpo needs β = trainer kl_coef > 0 and the reference log-probs")
    maskf = mask.to(logprobs.dtype)
    if sample_weights is None:
        sample_weights = aggregation_weights(mask, group_index, aggregation)
    mass = sample_weights.to(logprobs.dtype) * maskf.sum(dim=-1)  # each sample's share of the batch
    seq_logratio = ((logprobs - ref_logprobs.to(logprobs.dtype)) * maskf).sum(dim=-1)  # (N,)
    losses, margins = [], []
    for g in torch.unique(group_index):
        idx = (group_index == g).nonzero(as_tuple=True)[0]
        signs = advantages[idx]
        if idx.numel() != 2 or not (signs.max() > 0 > signs.min()):
            raise ValueError(f"dpo: group {int(g)} is not one chosen (+1) and one rejected (−1) sample in this "
                             f"micro-batch (advantages {signs.tolist()}); keep each pair whole")
        c, r = (idx[0], idx[1]) if signs[0] > 0 else (idx[1], idx[0])
        z = kl_coef * (seq_logratio[c] - seq_logratio[r])
        losses.append((mass[c] + mass[r]) * torch.nn.functional.softplus(-z))  # −log σ(z) = softplus(−z)
        margins.append(z.detach())
    loss = torch.stack(losses).sum()
    with torch.no_grad():
        valid, m = mask.bool(), torch.stack(margins)
        ratio = torch.exp(logprobs.detach() - old_logprobs.to(logprobs.dtype))
        metrics = _clip_metrics(loss, loss, ratio, torch.zeros_like(valid), valid, clip_eps, None)  # nothing clipped
        metrics["actor/kl"] = float(((logprobs.detach() - ref_logprobs) * maskf).sum()) / max(int(valid.sum()), 1)
        metrics.update({"actor/dpo_margin": float(m.mean()), "actor/dpo_accuracy": float((m > 0).float().mean())})
    return loss, metrics


@register_policy_loss("weighted_sft")
def weighted_sft_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Optional[Tensor], advantages: Tensor,
                      mask: Tensor, group_index: Tensor, sample_weights: Optional[Tensor] = None,
                      aggregation: str = "seq_group_mean", **_: object) -> tuple[Tensor, dict[str, float]]:
    """Value-weighted SFT (Socratic-Zero's Generator): −Σ_{n,t} w_n,t · u_n · log π_θ(y_n,t | ·), with u_n the
    example's weight (``advantages``; the Solver's utility of the imitated problem) and w the aggregation's
    token weights. The targets need not come from this policy (the Teacher wrote them): no ratio, no clip."""
    maskf = mask.to(logprobs.dtype)
    if sample_weights is None:
        sample_weights = aggregation_weights(mask, group_index, aggregation)
    token_weights = sample_weights.to(logprobs.dtype)[:, None] * maskf
    loss = -(token_weights * advantages.to(logprobs.dtype)[:, None] * logprobs).sum()
    n_tok = int(mask.sum().item())
    return loss, {"actor/loss": float(loss.detach()), "actor/pg_loss": float(loss.detach()),
                  "actor/nll": float(-(maskf * logprobs.detach()).sum()) / max(n_tok, 1),
                  "actor/num_tokens": float(n_tok)}
