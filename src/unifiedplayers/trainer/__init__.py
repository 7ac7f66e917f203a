"""Per-player GRPO trainers (Appendix B.3, D.2): torch and DeepSpeed ZeRO-2/3 backends. Use, inside a block::

    trainer = build_trainer(cfg.trainer, model, role="execution", entropy_bank=contexts)
    trainer.start_outer_iteration()      # π_ref := current weights
    trainer.start_block()                # block diagnostics reset, initial bank entropy
    metrics = trainer.update(samples)    # one optimizer step; samples: TrainSample-like items
    trainer.save_checkpoint(path); trainer.load_checkpoint(path)
    trainer.offload_state()              # block over: only the weights it samples with stay in memory
    trainer.block_diagnostics()          # block over: final bank entropy, retention, grad-norm median / CV

The update and its hooks: :mod:`~unifiedplayers.trainer.base`; backends by name: :mod:`~.backends`.
"""
from unifiedplayers.trainer.backends import TRAINER_BACKENDS, build_trainer, register_trainer_backend
from unifiedplayers.trainer.base import BaseTrainer
from unifiedplayers.trainer.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from unifiedplayers.trainer.diagnostics import EntropyRetention, grad_norm_block_stats
from unifiedplayers.trainer.logprobs import mean_token_entropy, selected_token_logprobs
from unifiedplayers.trainer.torch_backend import TorchTrainer  # the torch backend; registers "torch"
from unifiedplayers.trainer.sample import TrainSample, sample_from_completion

__all__ = ["TRAINER_BACKENDS", "BaseTrainer", "EntropyRetention", "TorchTrainer", "TrainSample", "atomic_directory",
           "build_trainer", "capture_rng_state", "grad_norm_block_stats", "mean_token_entropy", "register_trainer_backend",
           "restore_rng_state", "sample_from_completion", "selected_token_logprobs"]
