"""Mixed precision of the trainer: float32 master weights, gradients and AdamW state, the forward and backward through a
copy in the compute dtype refreshed after each optimizer step (:func:`copy_weights`: cast once per step, not at every
forward as autocast would), and float32 log-probs, ratios, KL and loss.
"""
from __future__ import annotations

import torch
from torch import nn

from unifiedplayers.models import cast_parameters  # noqa: F401 - the trainer's casts, re-exported

Tensor = torch.Tensor


def resolve_setting(name: str, device: torch.device | str) -> str:
    """A ``trainer.dtype`` setting as a dtype name (``auto`` resolved on ``device``; a run resolves it at its
    start, so here it only meets ``auto`` when a trainer is built outside a run)."""
    from unifiedplayers.precision import auto_dtype, check_setting

    if check_setting("trainer.dtype", name) != "auto":
        return name
    return auto_dtype(torch.device(device).type)[0]


@torch.no_grad()
def copy_weights(master: nn.Module, copy: nn.Module) -> None:
    """``copy``'s parameters := ``master``'s, cast to ``copy``'s dtypes (same module structure)."""
    for dst, src in zip(copy.parameters(), master.parameters()):
        dst.copy_(src)


def move_gradients(copy: nn.Module, master: nn.Module) -> None:
    """Add the gradients of ``copy`` (compute dtype) into ``master``'s (float32) and free them: the micro-batches of
    an update accumulate in float32, never in bf16."""
    for src, dst in zip(copy.parameters(), master.parameters()):
        if src.grad is None:
            continue
        if dst.grad is None:
            dst.grad = src.grad.to(dst.dtype)
        else:
            dst.grad.add_(src.grad)
        src.grad = None


def logprob_mismatch(train: Tensor, behaviour: Tensor, mask: Tensor) -> float:
    """Mean |log π_train − log π_behaviour| over the trained tokens (``mask``), float32."""
    m = mask.bool()
    count = int(m.sum())
    if count == 0:
        return 0.0
    return float((train.detach().float() - behaviour.float()).abs()[m].sum() / count)
