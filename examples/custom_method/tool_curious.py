"""A worked extension: a method defined outside the package, in one Python file and one YAML.

``tool_curious`` is UnifiedPlayers with one change, to the Planning player's reward: Eq. 2 plus a bonus for
tasks that the Execution player solves with the sandbox,

    r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q) + b · (1/K) Σ_k min(n_k, C)

with n_k the tool calls of trajectory k, b = ``method.extra.tool_bonus`` and C = ``method.extra.tool_call_cap``
(its typed settings below; an unknown or mistyped key fails at start-up). The reward is a reward source, which the
YAML names (``method.planning_reward: tool_curious:eq2_with_tool_bonus``); everything else is the base method's.

Train it (from the repository root)::

    PYTHONPATH=examples/custom_method python -m unifiedplayers.train experiment=smoke model=tiny_random \\
      method=tool_curious hydra.searchpath=[file://examples/custom_method/conf] run_dir=runs/tool_curious
"""
from __future__ import annotations

from dataclasses import dataclass

from unifiedplayers.methods import Method, register_method, register_reward_source


@dataclass
class ToolCuriousSettings:  # method.extra
    tool_bonus: float = 0.1  # b
    tool_call_cap: int = 2  # C


@register_reward_source("planning", "eq2_with_tool_bonus", reads_verdicts=True)  # Eq. 2's V(q) reads verdicts
def eq2_with_tool_bonus(fb) -> float:
    """r_T(q) of one task from its feedback ``fb`` (the settings of another method picking it: the defaults)."""
    s = fb.settings if isinstance(fb.settings, ToolCuriousSettings) else ToolCuriousSettings()
    bonus = s.tool_bonus * sum(min(n, s.tool_call_cap) for n in fb.tool_calls) / max(len(fb.tool_calls), 1)
    return float(fb.terms.planning) + bonus


@register_method("tool_curious")
class ToolCurious(Method):
    Settings = ToolCuriousSettings

    def check(self) -> None:
        super().check()
        if self.settings.tool_call_cap < 1 or not self.use_tools:
            raise ValueError("tool_curious needs method.use_tools=true and method.extra.tool_call_cap >= 1")
