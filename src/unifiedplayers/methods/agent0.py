"""Agent0 (Xia et al., arXiv 2511.16043; Appendix G.1): a Curriculum player (Planning) and an Executor (Execution,
multi-turn tool use), no Evaluation player (docs/baselines.md: what is kept and what departs).

Curriculum (``agent0_curriculum``, a batch source: the repetition penalty needs the whole batch):

  R_unc(x)  = 1 − 2·|p̂(x) − 1/2|                  (p̂: the Executor's self-consistency over its K samples)
  R_tool(x) = (1/K)·Σ_k γ·min(n_k, C)               (n_k tool calls of sample k; γ = ``method.extra.tool_bonus``,
                                                     C = ``method.extra.tool_call_cap``)
  R_rep(x)  = λ·|C(x)|/B                            (R-Zero's within-batch BLEU clustering, λ = 1)
  R_C(x)    = R_format(x)·max(0, R_unc + R_tool − R_rep)      (paper form, ``method.extra.reward_form=paper``)
  R_C(x)    = min(p̂, 1 − p̂) + R_tool − |C(x)|/B               (Agent0's code, curriculum_reward.py: ``code``)

  R_format = 0 (not a task) never reaches this source: it gets ``reward.malformed_task_reward``.

Executor: majority-vote pseudo-labels, trained only on tasks with p̂ ∈ ``method.extra.frontier_band``, with ADPO
(Agent0's core_algos.py ``adpo``; p_lo, p_hi, s_min, Δε: ``method.extra.adpo``):

  s(p̂)      = s_min + (1 − s_min)·clip((p̂ − p_lo)/(p_hi − p_lo), 0, 1)    scales the group-normalised advantage
  ε_high(p̂) = ε + Δε·clip((p_hi − p̂)/(p_hi − p_lo), 0, 1)                per-sample upper clip (the lower: 1 − ε)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from unifiedplayers.methods.base import GroupShape, Method, register_method
from unifiedplayers.methods.r_zero import ChallengerSettings, in_band, r_zero_challenger
from unifiedplayers.methods.sources import register_reward_source, self_consistency

if TYPE_CHECKING:
    from unifiedplayers.feedback.pipeline import TaskFeedback

DEFAULT_TOOL_WEIGHT = 0.05  # γ of Agent0's calculate_tool_reward
DEFAULT_TOOL_CALL_CAP = 4  # C
FRONTIER_BAND = (0.3, 0.8)


def tool_reward(tool_calls: Sequence[int], weight: float = DEFAULT_TOOL_WEIGHT,
                cap: int = DEFAULT_TOOL_CALL_CAP) -> float:
    """R_tool = mean over the K samples of γ·min(n_k, C); 0 for no samples."""
    if cap < 1:
        raise ValueError(f"tool_call_cap={cap}: need >= 1")
    n = np.asarray(list(tool_calls), dtype=np.float64)
    if n.size == 0:
        return 0.0
    if (n < 0).any():
        raise ValueError(f"negative tool-call counts: {list(tool_calls)}")
    return float(weight * np.minimum(n, cap).mean())


@dataclass
class AdpoSettings:
    """ADPO's constants (Agent0's train_qwen3_4b_adpo.sh)."""

    p_low: float = 0.3  # min_score_for_scaling
    p_high: float = 0.8  # max_score_for_scaling
    min_scale: float = 0.6  # min_advantage_scale
    max_epsilon_bonus: float = 0.1


@dataclass
class Agent0Settings(ChallengerSettings):
    """``method.extra`` of Agent0: the Curriculum's tool term and penalty, the Executor's frontier and ADPO."""

    tool_bonus: float = DEFAULT_TOOL_WEIGHT  # γ
    tool_call_cap: int = DEFAULT_TOOL_CALL_CAP  # C
    frontier_band: list[float] = field(default_factory=lambda: list(FRONTIER_BAND))
    adpo: AdpoSettings = field(default_factory=AdpoSettings)


def _tool_reward_of(fb: TaskFeedback) -> float:
    if not isinstance(fb.settings, Agent0Settings):  # another method picking this source: γ = 0, as before the move
        return tool_reward(fb.tool_calls, 0.0, DEFAULT_TOOL_CALL_CAP)
    return tool_reward(fb.tool_calls, float(fb.settings.tool_bonus), int(fb.settings.tool_call_cap))


@register_reward_source("planning", "agent0_curriculum", batch=True)
def agent0_curriculum(feedback: Sequence[TaskFeedback]) -> list[float]:
    return r_zero_challenger(feedback, bonus=[_tool_reward_of(fb) for fb in feedback])


def _ramp(x: float, lo: float, hi: float) -> float:
    if not hi > lo:
        raise ValueError(f"ADPO needs p_low < p_high, got {lo}, {hi}")
    return float(np.clip((x - lo) / (hi - lo), 0.0, 1.0))


def adpo_advantage_scale(p_hat: float, p_low: float = AdpoSettings.p_low, p_high: float = AdpoSettings.p_high,
                         min_scale: float = AdpoSettings.min_scale) -> float:
    """s(p̂) = s_min + (1 − s_min)·clip((p̂ − p_lo)/(p_hi − p_lo), 0, 1): trust in the pseudo-label."""
    return min_scale + (1.0 - min_scale) * _ramp(p_hat, p_low, p_high)


def adpo_clip_high(p_hat: float, clip_eps: float, p_low: float = AdpoSettings.p_low,
                   p_high: float = AdpoSettings.p_high,
                   max_epsilon_bonus: float = AdpoSettings.max_epsilon_bonus) -> float:
    """ε_high(p̂) = ε + Δε·clip((p_hi − p̂)/(p_hi − p_lo), 0, 1): more room upward on ambiguous tasks."""
    return clip_eps + max_epsilon_bonus * (1.0 - _ramp(p_hat, p_low, p_high))


@register_method("agent0")
class Agent0(Method):
    """Agent0: the Executor's groups are kept near the frontier, advantages scaled and upper clip widened by ADPO."""

    Settings = Agent0Settings

    def check(self) -> None:
        super().check()
        in_band(0.5, self.settings.frontier_band)
        _ramp(0.5, self.settings.adpo.p_low, self.settings.adpo.p_high)
        if int(self.settings.tool_call_cap) < 1:
            raise ValueError(f"method.extra.tool_call_cap={self.settings.tool_call_cap}: need >= 1")

    def group_shape(self, role: str, fb: TaskFeedback, clip_eps: float) -> GroupShape:
        if role != "execution":
            return GroupShape()
        p, adpo = self_consistency(fb), self.settings.adpo
        return GroupShape(
            keep=in_band(p, self.settings.frontier_band),
            adv_scale=adpo_advantage_scale(p, adpo.p_low, adpo.p_high, adpo.min_scale),
            clip_high=adpo_clip_high(p, clip_eps, adpo.p_low, adpo.p_high, adpo.max_epsilon_bonus),
        )
