"""Micro-batches of one update (Appendix B.3, Eq. 21): the split of a batch, right-padded collation, metric merging; pure
data handling over :class:`~unifiedplayers.trainer.sample.TrainSample`-like samples.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

import unifiedplayers.trainer.grpo as grpo

Tensor = torch.Tensor


def _as_tensor(x, dtype) -> Tensor:
    return x.to(dtype) if isinstance(x, Tensor) else torch.as_tensor(x, dtype=dtype)


@dataclass
class _MicroBatch:
    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    loss_mask: Tensor  # (B, L) bool
    old_logprobs: Tensor  # (B, L)
    advantages: Tensor  # (B,)
    groups: Tensor  # (B,)
    weights: Tensor  # (B,) Eq. 21 weights from the whole batch
    clip_high: Optional[Tensor] = None  # (B,) per-sample upper clip, NaN = trainer.clip_eps; None: none set
    behaviour_logprobs: Optional[Tensor] = None  # (B, L) the log-probs recorded at sampling (default: old_logprobs)
    recomputed: bool = False  # old_logprobs are the trainer's forward (trainer.recompute_old_logprobs)


def _collate(samples: list[Any], weights: Tensor, device: torch.device, pad_id: int) -> _MicroBatch:
    length = max(len(s.token_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    att = torch.zeros(b, length, dtype=torch.long)
    mask = torch.zeros(b, length, dtype=torch.bool)
    old = torch.zeros(b, length, dtype=torch.float32)
    recomputed = any(getattr(s, "behaviour_logprobs", None) is not None for s in samples)
    behaviour = torch.zeros(b, length, dtype=torch.float32) if recomputed else old
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = _as_tensor(s.token_ids, torch.long)
        att[i, :n] = 1
        mask[i, :n] = _as_tensor(s.loss_mask, torch.bool)
        old[i, :n] = _as_tensor(s.old_logprobs, torch.float32)
        if recomputed:
            source = s.old_logprobs if s.behaviour_logprobs is None else s.behaviour_logprobs
            behaviour[i, :n] = _as_tensor(source, torch.float32)
    old = old.masked_fill(~mask, 0.0)
    behaviour = behaviour.masked_fill(~mask, 0.0) if recomputed else old
    clip_high = None if all(getattr(s, "clip_high", None) is None for s in samples) else torch.tensor(
        [float("nan") if s.clip_high is None else float(s.clip_high) for s in samples], device=device)
    return _MicroBatch(ids.to(device), att.to(device), mask.to(device), old.to(device),
                       torch.tensor([float(s.advantage) for s in samples], device=device),
                       torch.tensor([int(s.group) for s in samples], device=device), weights.to(device), clip_high,
                       behaviour.to(device), recomputed)


@dataclass
class MicroBatchPlan:
    """This rank's micro-batches of one update."""

    micro: list[_MicroBatch]  # this rank's share, plus zero-weight lockstep copies where needed
    num_micro: int  # micro-batches of the whole batch, over all ranks
    real: int  # leading entries of ``micro`` that hold tokens of the batch (the rest are lockstep padding)
    per_rank: list[list[list[int]]] = field(default_factory=list)  # each rank's micro-batches' sample indices
    pad_share: float = 0.0  # padded positions / positions processed, over the whole batch's micro-batches


_warned_over_budget: set[int] = set()


def rank_micro_batches(lengths: Sequence[int], cfg, world_size: int = 1) -> list[list[list[int]]]:
    """Each rank's micro-batches of one update (sample indices), in the order it runs them: consecutive samples,
    micro-batch ``i`` on rank ``i mod world_size``; or, under ``trainer.max_tokens_per_micro_batch``, the samples
    longest first (ties in batch order) each to the rank with the fewest tokens, micro-batches filled while rows ×
    the longest sample fits the budget (a longer sample alone, with one warning)."""
    n = len(lengths)
    budget = getattr(cfg, "max_tokens_per_micro_batch", None)
    if budget is None:
        size = math.ceil(n / cfg.grad_accum_steps) if cfg.grad_accum_steps > 0 else cfg.micro_batch_size
        members = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        return [members[r::world_size] for r in range(world_size)]
    order = sorted(range(n), key=lambda i: -lengths[i])  # stable: equal lengths keep the batch's order
    shares: list[list[int]] = [[] for _ in range(world_size)]
    tokens = [0] * world_size
    for i in order:
        r = min(range(world_size), key=lambda k: (tokens[k], k))
        shares[r].append(i)
        tokens[r] += lengths[i]
    longest = lengths[order[0]] if order else 0
    if longest > budget and budget not in _warned_over_budget:
        _warned_over_budget.add(budget)
        warnings.warn(f"trainer.max_tokens_per_micro_batch={budget} is below the longest sample ({longest} tokens): "
                      f"each such sample is a micro-batch of its own", stacklevel=2)
    return [_fill(share, lengths, budget) for share in shares]


def _fill(share: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    members: list[list[int]] = []
    for i in share:  # longest first: a micro-batch's first sample is its longest
        if members and (len(members[-1]) + 1) * lengths[members[-1][0]] <= budget:
            members[-1].append(i)
        else:
            members.append([i])
    return members


def micro_batch_members(lengths: Sequence[int], cfg, world_size: int = 1) -> list[list[int]]:
    """Every micro-batch of one update (:func:`rank_micro_batches`), rank by rank."""
    return [m for share in rank_micro_batches(lengths, cfg, world_size) for m in share]


def pad_share(lengths: Sequence[int], members: Sequence[Sequence[int]]) -> float:
    """Padded positions / positions processed when each micro-batch is right-padded to its longest sample."""
    processed = sum(len(m) * max(lengths[i] for i in m) for m in members)
    return 1.0 - sum(lengths[i] for m in members for i in m) / processed if processed else 0.0


def plan_micro_batches(samples: Sequence[Any], cfg, *, rank: int, world_size: int, lockstep: bool,
                       device: torch.device, pad_id: int) -> MicroBatchPlan:
    """Split ``samples`` into micro-batches and collate this rank's share, with the Eq. 21 weights of the whole batch.
    Under ``lockstep`` a rank with fewer micro-batches than the busiest runs zero-weight copies until it has as many."""
    counts = torch.tensor([int(_as_tensor(s.loss_mask, torch.long).sum()) for s in samples])
    groups = torch.tensor([int(s.group) for s in samples])
    weights = grpo.get_aggregation(cfg.aggregation)(counts, groups)
    lengths = [len(s.token_ids) for s in samples]
    per_rank = rank_micro_batches(lengths, cfg, world_size)

    def collate(idx: list[int], w: Tensor) -> _MicroBatch:
        return _collate([samples[i] for i in idx], w, device, pad_id)

    micro = [collate(idx, weights[idx]) for idx in per_rank[rank]]
    real = len(micro)
    busiest = max(len(share) for share in per_rank)
    if lockstep and real < busiest:
        # Zero Eq. 21 weights: no loss, no gradient, but the same collectives as the other ranks.
        first = next(share[0] for share in [per_rank[rank], *per_rank] if share)
        micro += [collate(first, torch.zeros(len(first))) for _ in range(busiest - real)]
    members = [m for share in per_rank for m in share]
    return MicroBatchPlan(micro, len(members), real, per_rank, pad_share(lengths, members))


def _combine_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Merge micro-batch metrics: losses add (global weights), min/max reduce, token means re-weight."""
    out: dict[str, float] = {}
    tokens = [p.get("actor/num_tokens", 0.0) for p in parts]
    total_tokens = sum(tokens)
    for key in parts[0]:
        values = [p[key] for p in parts if key in p]
        if key in ("actor/loss", "actor/pg_loss", "actor/num_tokens", "perf/update_tflop"):
            out[key] = float(sum(values))
        elif key.endswith("_min"):
            out[key] = float(min(values))
        elif key.endswith("_max"):
            out[key] = float(max(values))
        else:
            w = [t for p, t in zip(parts, tokens) if key in p]
            out[key] = float(sum(v * t for v, t in zip(values, w)) / max(sum(w), 1.0))
    out["actor/num_tokens"] = float(total_tokens)
    return out
