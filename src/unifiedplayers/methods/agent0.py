"""Agent0 (SPEC §11): a Curriculum player (the Planning role) and an Executor (the Execution role) trained by
GRPO in turns, no Evaluation player.

- Executor: majority-vote pseudo-labels over its own K tool-using samples (``majority_vote``).
- Curriculum: r(q) = w_unc · U(q) + λ_tool · f_tool(q) − w_rep · R(q)  (``agent0_curriculum``), with U(q) the
  Executor's self-consistency uncertainty min(p̂, 1 − p̂), R(q) the BLEU repetition penalty (both as in
  ``unifiedplayers.rewards``) and f_tool(q) the tool-call frequency of the K samples,
  f_tool = (1/K) Σ_k min(n_k, C)/C  (n_k tool calls of sample k, cap C = ``method.extra.tool_call_cap``, 4),
  weighted by λ_tool = ``method.tool_bonus``. The cap keeps the bonus from rewarding endless tool loops.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from unifiedplayers.methods import TaskFeedback, register_reward_source

DEFAULT_TOOL_CALL_CAP = 4


def tool_call_frequency(tool_calls: Sequence[int], cap: int = DEFAULT_TOOL_CALL_CAP) -> float:
    """f_tool = mean over the samples of min(n_k, cap)/cap, in [0, 1]; 0 for no samples."""
    if cap < 1:
        raise ValueError(f"tool_call_cap={cap}: need >= 1")
    n = np.asarray(list(tool_calls), dtype=np.float64)
    if n.size == 0:
        return 0.0
    if (n < 0).any():
        raise ValueError(f"negative tool-call counts: {list(tool_calls)}")
    return float(np.minimum(n, cap).mean() / cap)


def curriculum_reward(uncertainty: float, tool_frequency: float, repetition: float, tool_bonus: float,
                      w_unc: float = 1.0, w_rep: float = 0.5) -> float:
    """r(q) = w_unc·U + λ_tool·f_tool − w_rep·R."""
    return float(w_unc * uncertainty + tool_bonus * tool_frequency - w_rep * repetition)


@register_reward_source("planning", "agent0_curriculum")
def agent0_curriculum(fb: TaskFeedback) -> float:
    m, c = fb.method_cfg, fb.reward_cfg
    bonus = float(m.tool_bonus) if m is not None else 0.0
    cap = int((m.extra or {}).get("tool_call_cap", DEFAULT_TOOL_CALL_CAP)) if m is not None else DEFAULT_TOOL_CALL_CAP
    return curriculum_reward(fb.rewards.uncertainty, tool_call_frequency(fb.tool_calls, cap), fb.rewards.repetition,
                             bonus, c.w_unc, c.w_rep)
