"""Optimisation diagnostics (§4.4, Appendix D.2; Tables 4, 7, 8).

- :func:`grad_norm_block_stats`: median and coefficient of variation of the pre-clipping global gradient
  norms of one block.
- :class:`EntropyRetention`: mean token entropy on a fixed bank of held-out role contexts at block start
  and after each update; ``ratio`` = final / initial.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


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
