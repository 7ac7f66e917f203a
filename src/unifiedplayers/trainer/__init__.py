"""Per-player GRPO trainers (Appendix B.3, D.2): torch and DeepSpeed ZeRO-2/3 backends, checkpoints, diagnostics.

Public interface::

    trainer = build_trainer(cfg.trainer, model, role="execution", entropy_bank=contexts)
    trainer.start_outer_iteration()      # π_ref := current weights
    trainer.start_block()                # block diagnostics reset, initial bank entropy
    metrics = trainer.update(samples)    # one optimizer step; samples: TrainSample-like items
    trainer.save_checkpoint(path); trainer.load_checkpoint(path)
    trainer.offload_state()              # block over: only the weights it samples with stay in memory
    trainer.block_diagnostics()          # grad-norm median / CV, entropy retention

Modules: ``base`` (the interface: samples, optimizer, backend registry, :class:`BaseTrainer` with the
shared update), ``batching`` (micro-batches), ``player_trainer`` (torch backend, :class:`PlayerTrainer`),
``deepspeed_backend`` (ZeRO-2/3, imported when built), ``offload`` (an idle player's state in files), ``logprobs``,
``checkpoint``, ``diagnostics``, ``flops``. Backends import ``base``, never each other.
"""
from unifiedplayers.trainer.base import (
    TRAINER_BACKENDS,
    BaseTrainer,
    TrainSample,
    as_sample,
    build_trainer,
    make_optimizer,
    make_scheduler,
    register_trainer_backend,
    sample_from_completion,
    sample_from_segments,
)
from unifiedplayers.trainer.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from unifiedplayers.trainer.diagnostics import EntropyRetention, grad_norm_block_stats
from unifiedplayers.trainer.logprobs import mean_token_entropy, selected_token_logprobs
from unifiedplayers.trainer.player_trainer import PlayerTrainer  # the torch backend; registers "torch"

__all__ = [
    "TRAINER_BACKENDS",
    "BaseTrainer",
    "EntropyRetention",
    "PlayerTrainer",
    "TrainSample",
    "as_sample",
    "atomic_directory",
    "build_trainer",
    "capture_rng_state",
    "grad_norm_block_stats",
    "make_optimizer",
    "make_scheduler",
    "mean_token_entropy",
    "register_trainer_backend",
    "restore_rng_state",
    "sample_from_completion",
    "sample_from_segments",
    "selected_token_logprobs",
]
