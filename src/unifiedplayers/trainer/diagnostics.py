"""Optimisation diagnostics (§4.4, Appendix D.2; Tables 4, 7, 8).

- :func:`grad_norm_block_stats`: median and coefficient of variation of the pre-clipping global gradient
  norms of one block.
- :class:`EntropyRetention`: mean token entropy on a fixed bank of held-out role contexts at the block's start and
  end (``trainer.entropy_every`` = n > 0: also after every n-th update); ``ratio`` = final / initial. Data-parallel
  ranks share the bank's micro-batches (:mod:`unifiedplayers.trainer.entropy`).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch

from unifiedplayers.trainer.batching import _as_tensor
from unifiedplayers.trainer.entropy import shared_mean_token_entropy

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


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """``count`` torch threads while inside (0: the count as it is), the count restored after."""
    before = torch.get_num_threads()
    if count <= 0 or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class EntropyRetention:
    """Track the bank entropy over one block: the first value is the initial one, the last the final. ``step``: the
    trainer's global step whose weights the last value scored (None: not known, as after a checkpoint load)."""

    history: list[float] = field(default_factory=list)
    step: Optional[int] = None

    def reset(self) -> None:
        self.history.clear()
        self.step = None

    def record(self, value: float, step: Optional[int] = None) -> None:
        self.history.append(float(value))
        self.step = step

    def state(self) -> dict[str, Any]:
        """What a trainer checkpoint keeps of it (``trainer_state.pt``)."""
        return {"entropy_history": list(self.history), "entropy_step": self.step}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "EntropyRetention":
        """From :meth:`state` (a checkpoint written before ``entropy_step`` existed: the step is not known)."""
        return cls(list(state["entropy_history"]), state.get("entropy_step"))

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
    ``block_grad_norms``, ``global_step``, ``compute_model``, ``dist`` and ``lockstep_micro_batches``."""

    def _record_bank_entropy(self, metrics: dict[str, float]) -> None:
        """After every ``entropy_every``-th update (n > 0): the bank entropy and its retention into ``metrics``."""
        cfg = self.cfg
        if self.entropy_bank and cfg.entropy_every > 0 and self.global_step % cfg.entropy_every == 0:
            t5 = time.perf_counter()
            self.entropy.record(self.bank_entropy(), self.global_step)
            metrics["entropy_bank/mean"] = self.entropy.final
            metrics["entropy_ratio"] = self.entropy.ratio  # the retention so far: <role>/entropy_ratio
            metrics["perf/time_entropy_bank"] = time.perf_counter() - t5

    # ------------------------------------------------------------------ diagnostics (Appendix D.2)
    def set_entropy_bank(self, contexts: Sequence[Sequence[int] | Tensor]) -> None:
        """Fix the held-out role contexts (the first ``entropy_bank_size`` are kept)."""
        self.entropy_bank = [_as_tensor(c, torch.long) for c in list(contexts)[: self.cfg.entropy_bank_size]]

    def bank_entropy(self) -> float:
        """Mean token entropy of the current policy on the entropy bank; data-parallel ranks share the bank (every
        rank calls it, and every rank gets the one-rank value, bit for bit)."""
        if not self.entropy_bank:
            raise RuntimeError("no entropy bank: pass entropy_bank= to build_trainer or call set_entropy_bank")
        return shared_mean_token_entropy(self.compute_model, self.entropy_bank, self.dist,
                                         lockstep=self.lockstep_micro_batches)

    def start_block(self) -> dict[str, float]:
        """Reset block diagnostics; record the initial bank entropy if a bank is set."""
        self.block_grad_norms = []
        self.entropy.reset()
        if self.entropy_bank:
            self.entropy.record(self.bank_entropy(), self.global_step)
            return {"entropy_bank/initial": self.entropy.initial}
        return {}

    def block_diagnostics(self) -> dict[str, float]:
        """The block is over (called once, on every rank, after its last update): grad-norm median and CV of the
        block, and entropy retention (Appendix D.2): the final bank entropy is scored now, unless the last score is
        of these weights already (the block's start without an update since, or an ``entropy_every``-th update)."""
        if self.entropy_bank and self.entropy.history and self.entropy.step != self.global_step:
            with torch_threads(getattr(self.cfg, "update_threads", 0)):  # as inside an update: the same floats
                self.entropy.record(self.bank_entropy(), self.global_step)
        out = grad_norm_block_stats(self.block_grad_norms)
        if self.entropy.ratio is not None:
            out["entropy_bank/initial"] = self.entropy.initial
            out["entropy_bank/final"] = self.entropy.final
            out["entropy_bank/retention"] = self.entropy.ratio
        return out
