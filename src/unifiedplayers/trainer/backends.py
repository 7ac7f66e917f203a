"""Trainer backends by name (``trainer.backend``, Appendix B.3): a :class:`~unifiedplayers.trainer.base.BaseTrainer`
subclass, or any factory with its signature. The built-in ones are listed as ``"module:Class"`` and imported on first
use (importing the module registers its classes), so DeepSpeed is imported only by a run that names a ZeRO backend.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from unifiedplayers.registry import Registry
from unifiedplayers.trainer.base import BaseTrainer

TRAINER_BACKENDS = Registry("trainer backend", "trainer.backend")
TRAINER_BACKENDS.register("torch", "unifiedplayers.trainer.torch_backend:TorchTrainer")
TRAINER_BACKENDS.register("deepspeed_zero2", "unifiedplayers.trainer.deepspeed_backend:DeepSpeedZero2Trainer")
TRAINER_BACKENDS.register("deepspeed_zero3", "unifiedplayers.trainer.deepspeed_backend:DeepSpeedZero3Trainer")


def register_trainer_backend(name: str):
    """Class or factory decorator: build it for ``trainer.backend: name`` (a name already taken is refused)."""
    return TRAINER_BACKENDS.register(name)


def _resolve_backend(name: str) -> Callable[..., BaseTrainer]:
    return TRAINER_BACKENDS.get(name)


def build_trainer(cfg, model: nn.Module, **kwargs) -> BaseTrainer:
    """The trainer of one player for ``cfg.backend``; ``kwargs``: ``role``, ``entropy_bank`` (held-out role contexts
    as token-id lists), ``pad_token_id``, ``dist`` (data-parallel ranks; one process by default)."""
    return _resolve_backend(cfg.backend)(cfg, model, **kwargs)
