"""The optimizer and learning-rate schedule every trainer backend uses (Appendix D.1): AdamW with β = (0.9, 0.95)
and weight decay 0.01 on the weight matrices only (:func:`optimizer_param_groups`, :func:`make_optimizer`), and a
linear warm-up over ``trainer.lr_warmup_steps`` optimizer steps, then a constant rate (:func:`make_scheduler`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def optimizer_param_groups(cfg, model: nn.Module) -> list[dict[str, Any]]:
    """AdamW's parameter groups (Appendix D.1: weight decay 0.01): no decay on biases and norm gains (1-D)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def make_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW (Appendix D.1: β = (0.9, 0.95)) over :func:`optimizer_param_groups`."""
    groups = optimizer_param_groups(cfg, model)
    # The fused kernel makes one pass over parameters and state instead of a dozen foreach passes; same update rule.
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps, fused=fused or None)


def make_scheduler(cfg, optimizer: torch.optim.Optimizer):
    """Linear warm-up over ``lr_warmup_steps`` optimizer steps, then constant."""
    warmup = int(cfg.lr_warmup_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _Warmup(warmup))


class _Warmup:
    """Picklable LR multiplier (a lambda would be dropped from the scheduler's state dict)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, step: int) -> float:
        return 1.0 if self.steps <= 0 else min(1.0, (step + 1) / self.steps)
