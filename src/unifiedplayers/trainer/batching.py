"""Micro-batches of one update (Appendix B.3, Eq. 21): the split of a batch, right-padded collation, metric merging.

Pure data handling, no model and no optimizer; :class:`~unifiedplayers.trainer.base.BaseTrainer` calls it.
Samples are :class:`~unifiedplayers.trainer.sample.TrainSample`-like (``token_ids``, ``loss_mask``,
``old_logprobs``, ``advantage``, ``group``, optional ``clip_high``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
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
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = _as_tensor(s.token_ids, torch.long)
        att[i, :n] = 1
        mask[i, :n] = _as_tensor(s.loss_mask, torch.bool)
        old[i, :n] = _as_tensor(s.old_logprobs, torch.float32)
    old = old.masked_fill(~mask, 0.0)
    behaviour = old
    recomputed = any(getattr(s, "behaviour_logprobs", None) is not None for s in samples)
    if recomputed:
        behaviour = torch.zeros(b, length, dtype=torch.float32)
        for i, s in enumerate(samples):
            source = s.old_logprobs if s.behaviour_logprobs is None else s.behaviour_logprobs
            behaviour[i, : len(s.token_ids)] = _as_tensor(source, torch.float32)
        behaviour = behaviour.masked_fill(~mask, 0.0)
    return _MicroBatch(
        ids.to(device),
        att.to(device),
        mask.to(device),
        old.to(device),
        torch.tensor([float(s.advantage) for s in samples], device=device),
        torch.tensor([int(s.group) for s in samples], device=device),
        weights.to(device),
        None if all(getattr(s, "clip_high", None) is None for s in samples) else torch.tensor(
            [float("nan") if s.clip_high is None else float(s.clip_high) for s in samples], device=device),
        behaviour.to(device),
        recomputed,
    )


@dataclass
class MicroBatchPlan:
    """This rank's micro-batches of one update."""

    micro: list[_MicroBatch]  # this rank's share, plus a zero-weight lockstep copy where needed
    num_micro: int  # micro-batches of the whole batch, over all ranks
    real: int  # leading entries of ``micro`` that hold tokens of the batch (the rest are lockstep padding)
    size: int = 0  # samples per micro-batch (the last may hold fewer)


def plan_micro_batches(
    samples: Sequence[Any],
    cfg,
    *,
    rank: int,
    world_size: int,
    lockstep: bool,
    device: torch.device,
    pad_id: int,
) -> MicroBatchPlan:
    """Split ``samples`` into micro-batches and collate this rank's share (Appendix B.3).

    The Eq. 21 aggregation weights are computed over the *whole* batch, so micro-batches with gradient
    accumulation give exactly the loss and gradient of the full batch. Rank ``r`` of ``world_size`` runs
    the micro-batches ``i`` with ``i mod world_size = r``. Under ``lockstep`` (a backend whose forward and
    backward are collectives) a rank with one micro-batch fewer than the others runs a zero-weight copy of
    the first one.
    """
    counts = torch.tensor([int(_as_tensor(s.loss_mask, torch.long).sum()) for s in samples])
    groups = torch.tensor([int(s.group) for s in samples])
    weights = grpo.get_aggregation(cfg.aggregation)(counts, groups)
    size = math.ceil(len(samples) / cfg.grad_accum_steps) if cfg.grad_accum_steps > 0 else cfg.micro_batch_size
    starts = list(range(0, len(samples), size))
    num_micro = len(starts)
    mine = starts[rank::world_size]  # this rank's share (all of them on one rank)
    micro = [_collate(samples[i : i + size], weights[i : i + size], device, pad_id) for i in mine]
    real = len(micro)
    if lockstep and real < math.ceil(num_micro / world_size):
        # Zero Eq. 21 weights: no loss, no gradient, but the same collectives as the other ranks.
        micro.append(_collate(samples[:size], torch.zeros(min(size, len(samples))), device, pad_id))
    return MicroBatchPlan(micro, num_micro, real, size)


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
