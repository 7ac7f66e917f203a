"""The entropy bank's mean token entropy (Appendix D.2) scored by data-parallel ranks together, bit for bit as one rank.

:func:`~unifiedplayers.trainer.logprobs.mean_token_entropy` runs the bank as micro-batches and adds, in bank order, the
entropy sum of each :data:`~unifiedplayers.trainer.logprobs.ENTROPY_ROWS`-row part. Here rank r of N runs micro-batches
r, r + N, ... of that same split, and the (sum, rows) of every part are all-gathered and added in the one-rank order.
Under ZeRO-3 (``lockstep``) every rank calls the decoder and the LM head as often as the others: a rank short of a
micro-batch runs micro-batch 0 again and discards it, and one short of a part calls the head on one zero row. Every
rank knows the whole bank, so each works out the others' part counts without asking.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.trainer.logprobs import (ENTROPY_BATCH, ENTROPY_ROWS, entropy_part_sums, eval_mode,
                                             mean_token_entropy, rows_entropy_sum, split_causal_lm)

Tensor = torch.Tensor
PartSums = list[tuple[float, int]]  # per 512-row part of a micro-batch: (Σ token entropy, rows)


def rank_passes(num_micro: int, rank: int, world_size: int, lockstep: bool = False) -> list[Optional[int]]:
    """The micro-batches rank ``rank`` of ``world_size`` scores, in order: ``rank``, ``rank + N``, ...; with
    ``lockstep``, ``None`` (a throw-away pass) for each micro-batch the busiest rank has more."""
    mine: list[Optional[int]] = list(range(rank, num_micro, world_size))
    if lockstep:
        mine += [None] * (-(-num_micro // world_size) - len(mine))
    return mine


def head_calls(parts: list[int], world_size: int) -> list[int]:
    """Per lockstep pass, the most LM-head calls a rank makes in it; ``parts[i]``: the parts of micro-batch i (a
    throw-away pass runs micro-batch 0)."""
    passes = -(-len(parts) // world_size)
    return [max(parts[i] if i < len(parts) else parts[0] for i in range(j * world_size, (j + 1) * world_size))
            for j in range(passes)]


@torch.no_grad()
def bank_part_sums(model: nn.Module, contexts: list[Tensor], dist: DistContext = SINGLE,
                   batch_size: int = ENTROPY_BATCH, lockstep: bool = False) -> list[PartSums]:
    """The (Σ token entropy, rows) of every part of every micro-batch of the bank, in the one-rank order, on every
    rank; each rank runs its share (module docstring). ``lockstep``: as many decoder and LM-head calls on every rank."""
    body, head = split_causal_lm(model)
    device = next(model.parameters()).device
    batches = [contexts[s : s + batch_size] for s in range(0, len(contexts), batch_size)]
    parts = [-(-sum(len(c) for c in b) // ENTROPY_ROWS) for b in batches]
    passes = rank_passes(len(batches), dist.rank, dist.world_size, lockstep)
    calls = head_calls(parts, dist.world_size) if lockstep else [0] * len(passes)
    mine: list[PartSums] = []
    with eval_mode(model):
        for index, wanted in zip(passes, calls):
            sums = entropy_part_sums(body, head, batches[0 if index is None else index], device)
            for _ in range(wanted - len(sums)):  # the head call another rank makes in this pass
                rows_entropy_sum(head, torch.zeros(1, head.in_features, dtype=head.weight.dtype, device=device))
            if index is not None:
                mine.append(sums)
    by_rank = dist.all_gather(mine)
    return [by_rank[i % dist.world_size][i // dist.world_size] for i in range(len(batches))]


def mean_of_parts(parts: list[PartSums]) -> float:
    """Σ entropy / Σ rows, added part by part in order (as :func:`~.logprobs.mean_token_entropy` adds them)."""
    total, count = 0.0, 0
    for micro in parts:
        for part_sum, rows in micro:
            total += part_sum
            count += rows
    return total / max(count, 1)


def shared_mean_token_entropy(model: nn.Module, contexts: list[Tensor], dist: DistContext = SINGLE,
                              batch_size: int = ENTROPY_BATCH, lockstep: bool = False) -> float:
    """:func:`~.logprobs.mean_token_entropy` of ``contexts``, bit for bit, with the ranks of ``dist`` sharing the
    micro-batches (one rank: that function itself)."""
    if not dist.enabled:
        return mean_token_entropy(model, contexts, batch_size)
    return mean_of_parts(bank_part_sums(model, contexts, dist, batch_size, lockstep))
