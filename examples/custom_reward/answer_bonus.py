"""A reward term outside the package: the Execution player's Eq. 4 reward plus a bonus for giving an answer.

    r(τ_k) = share of the valid verifiers that accept τ_k  +  BONUS · [τ_k ends with a final answer]

At 135M parameters the Execution player often ends without a ``\\boxed{}`` answer, so every verifier rejects
every trajectory and the group's rewards tie at 0 (GRPO learns nothing from a tie). The bonus separates a
trajectory that answers from one that does not. Pick it with ``method.execution_reward=answer_bonus:verdict_with_answer_bonus``
(the module on ``PYTHONPATH``); change ``BONUS`` here.
"""
from __future__ import annotations

import numpy as np

from unifiedplayers.methods import register_reward_source

BONUS = 0.1


@register_reward_source("execution", "verdict_with_answer_bonus", reads_verdicts=True)
def verdict_with_answer_bonus(fb) -> np.ndarray:
    """One reward per trajectory of the task (shape (K,)), from its :class:`TaskFeedback` ``fb``."""
    answered = np.array([a is not None and bool(str(a).strip()) for a in fb.answers], dtype=np.float64)
    return np.asarray(fb.terms.execution, dtype=np.float64) + BONUS * answered
