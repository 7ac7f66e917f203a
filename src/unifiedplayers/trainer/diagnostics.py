"""Optimisation diagnostics (§4.4, Appendix D.2; Tables 4, 7, 8).

- :func:`grad_norm_block_stats`: median and coefficient of variation of the pre-clipping global gradient
  norms of one block.
- :class:`EntropyRetention`: mean token entropy on a fixed bank of held-out role contexts at block start
  and after each update; ``ratio`` = final / initial.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from unifiedplayers.trainer.batching import _as_tensor
from unifiedplayers.trainer.logprobs import mean_token_entropy

Tensor = torch.Tensor


def grad_norm_block_stats(grad_norms: Sequence[float]) -> dict[str, float]:
    """Median and CV (population std / mean) of a block's pre-clipping gradient norms.

    Non-finite norms (an overflowing step) are dropped and counted separately so that one bad step does
    not turn the block's statistics into NaN.
    """
    values = np.asarray([g for g in grad_norms if g is not None], dtype=np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"grad_norm/median": math.nan, "grad_norm/cv": math.nan, "grad_norm/num_nonfinite": float(values.size)}
    mean = float(finite.mean())
    return {
        "grad_norm/median": float(np.median(finite)),
        "grad_norm/cv": float(finite.std() / mean) if mean > 0 else math.nan,
        "grad_norm/num_nonfinite": float(values.size - finite.size),
    }


@dataclass
class EntropyRetention:
    """Track the bank entropy over one block: the first value is the initial one, the last the final."""

    history: list[float] = field(default_factory=list)

    def reset(self) -> None:
        self.history.clear()

    def record(self, value: float) -> None:
        self.history.append(float(value))

    @property
    def initial(self) -> Optional[float]:
        return self.history[0] if self.history else None

    @property
    def final(self) -> Optional[float]:
        return self.history[-1] if self.history else None

    @property
    def ratio(self) -> Optional[float]:
        """final / initial mean token entropy (Appendix D.2); None before the block's first measurement."""
        if not self.history or self.history[0] == 0:
            return None
        return self.history[-1] / self.history[0]


class BlockDiagnostics:
    """The diagnostics part of a trainer (:class:`~unifiedplayers.trainer.base.BaseTrainer`): bank entropy and its
    retention, the block's grad-norm statistics. Uses the trainer's ``cfg``, ``entropy_bank``, ``entropy``,
    ``block_grad_norms``, ``global_step`` and ``compute_model``."""

    def _record_bank_entropy(self, metrics: dict[str, float]) -> None:
        """Every ``entropy_every`` steps: the bank entropy and its retention (Appendix D.2) into ``metrics``."""
        cfg = self.cfg
        if self.entropy_bank and cfg.entropy_every > 0 and self.global_step % cfg.entropy_every == 0:
            t5 = time.perf_counter()
            self.entropy.record(self.bank_entropy())
            metrics["entropy_bank/mean"] = self.entropy.final
            metrics["entropy_bank/retention"] = self.entropy.ratio
            metrics["perf/time_entropy_bank"] = time.perf_counter() - t5

    # ------------------------------------------------------------------ diagnostics (Appendix D.2)
    def set_entropy_bank(self, contexts: Sequence[Sequence[int] | Tensor]) -> None:
        """Fix the held-out role contexts (the first ``entropy_bank_size`` are kept)."""
        self.entropy_bank = [_as_tensor(c, torch.long) for c in list(contexts)[: self.cfg.entropy_bank_size]]

    def bank_entropy(self) -> float:
        """Mean token entropy of the current policy on the entropy bank."""
        if not self.entropy_bank:
            raise RuntimeError("no entropy bank: pass entropy_bank= to build_trainer or call set_entropy_bank")
        return mean_token_entropy(self.compute_model, self.entropy_bank)

    def start_block(self) -> dict[str, float]:
        """Reset block diagnostics; record the initial bank entropy if a bank is set."""
        self.block_grad_norms = []
        self.entropy.reset()
        if self.entropy_bank:
            self.entropy.record(self.bank_entropy())
            return {"entropy_bank/initial": self.entropy.initial}
        return {}

    def block_diagnostics(self) -> dict[str, float]:
        """Grad-norm median and CV of the block, and entropy retention (final / initial)."""
        out = grad_norm_block_stats(self.block_grad_norms)
        if self.entropy.ratio is not None:
            out["entropy_bank/initial"] = self.entropy.initial
            out["entropy_bank/final"] = self.entropy.final
            out["entropy_bank/retention"] = self.entropy.ratio
        return out
