"""Per-player GRPO trainers (SPEC §6, §8): torch and DeepSpeed ZeRO-2/3 backends, checkpoints, diagnostics.

Public interface::

    trainer = build_trainer(cfg.trainer, model, role="execution", entropy_bank=contexts)
    trainer.start_outer_iteration()      # π_ref := current weights
    trainer.start_block()                # block diagnostics reset, initial bank entropy
    metrics = trainer.update(samples)    # one optimizer step; samples: TrainSample-like items
    trainer.save_checkpoint(path); trainer.load_checkpoint(path)
    trainer.offload_state()              # drop optimizer state when the block ends
    trainer.block_diagnostics()          # grad-norm median / CV, entropy retention
"""
from unifiedplayers.trainer.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from unifiedplayers.trainer.diagnostics import EntropyRetention, grad_norm_block_stats
from unifiedplayers.trainer.logprobs import mean_token_entropy, selected_token_logprobs
from unifiedplayers.trainer.player_trainer import (
    TRAINER_BACKENDS,
    PlayerTrainer,
    TrainSample,
    as_sample,
    build_trainer,
    make_optimizer,
    make_scheduler,
    register_trainer_backend,
    sample_from_completion,
    sample_from_segments,
)

__all__ = [
    "TRAINER_BACKENDS",
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
