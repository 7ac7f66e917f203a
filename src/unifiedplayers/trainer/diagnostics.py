"""Optimisation diagnostics (§4.4, Appendix D.2; Tables 4, 7, 8): the pre-clipping gradient norms' median and CV of a
block (:func:`grad_norm_block_stats`), and the entropy retention on a bank of held-out role contexts
(:class:`EntropyRetention`, ``ratio`` = final / initial).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np


def grad_norm_block_stats(grad_norms: Sequence[float]) -> dict[str, float]:
    """Median and CV (population std / mean) of a block's pre-clipping gradient norms; non-finite ones are dropped
    and counted apart."""
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

