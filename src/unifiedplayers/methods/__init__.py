"""Methods: UnifiedPlayers and its baselines (§4.1, Appendix G.1) behind one interface (:mod:`.base`, the hooks;
:mod:`.sources`, the reward sources). The baselines, imported when a run names them: :mod:`.r_zero`, :mod:`.agent0`,
:mod:`.absolute_zero`, :mod:`.socratic_zero`.
"""
from __future__ import annotations

from typing import Optional, Sequence

from unifiedplayers.methods.base import METHODS, GroupShape, Method, build_method, register_method
from unifiedplayers.methods.sources import (REWARD_SOURCES, RewardSource, register_reward_source, reward_source,
                                            self_consistency)


def shape_advantages(shapes: dict[int, GroupShape], group_ids: Sequence[int],
                     advantages: Sequence[float]) -> list[tuple[int, float, Optional[float]]]:
    """Each group's shape (``shapes[g]``; none: plain GRPO) applied to its samples' GRPO advantages (Eq. 17 first):
    ``(n, adv_scale·Â_n, clip_high)`` for every sample ``n`` of a kept group, in sample order."""
    if len(group_ids) != len(advantages):
        raise ValueError(f"{len(group_ids)} group ids for {len(advantages)} advantages")
    out = []
    for n, (g, a) in enumerate(zip(group_ids, advantages)):
        shape = shapes.get(g, GroupShape())
        if shape.keep:
            out.append((n, float(shape.adv_scale) * float(a), shape.clip_high))
    return out


__all__ = ["METHODS", "REWARD_SOURCES", "GroupShape", "Method", "RewardSource", "build_method", "register_method",
           "register_reward_source", "reward_source", "self_consistency", "shape_advantages"]
