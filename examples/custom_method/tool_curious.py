"""A worked extension: a method defined outside the package, in one Python file and one YAML.

``tool_curious`` is UnifiedPlayers with one change, to the Planning player's reward: Eq. 2 plus a bonus for
tasks that the Execution player solves with the sandbox,

    r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q) + b · (1/K) Σ_k min(n_k, C)

with n_k the tool calls of trajectory k, b = ``method.extra.tool_bonus`` and C = ``method.extra.tool_call_cap``
(its typed settings below; an unknown or mistyped key fails at start-up). Everything else is the base method's.

Train it (from the repository root)::

    PYTHONPATH=examples/custom_method python -m unifiedplayers.train experiment=smoke model=tiny_random \\
      method=tool_curious hydra.searchpath=[file://examples/custom_method/conf] run_dir=runs/tool_curious
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from unifiedplayers.methods import Method, register_method


@register_method("tool_curious")
class ToolCurious(Method):
    @dataclass
    class Settings:  # method.extra
        tool_bonus: float = 0.1  # b
        tool_call_cap: int = 2  # C

    def rewards(self, role: str, feedback: Sequence[Any]) -> list[Any]:
        out = super().rewards(role, feedback)  # Eq. 2, 4, 5 (the sources named in the YAML)
        if role != "planning":
            return out
        b, cap = self.settings.tool_bonus, self.settings.tool_call_cap
        return [r + b * sum(min(n, cap) for n in fb.tool_calls) / max(len(fb.tool_calls), 1)
                for r, fb in zip(out, feedback)]

    def check(self) -> None:
        super().check()
        if self.settings.tool_call_cap < 1 or not self.use_tools:
            raise ValueError("tool_curious needs method.use_tools=true and method.extra.tool_call_cap >= 1")
