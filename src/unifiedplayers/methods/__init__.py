"""Methods: UnifiedPlayers and its baselines (§4.1, Appendix G.1) behind one interface (:mod:`.base`, the hooks;
:mod:`.sources`, the reward sources). The baselines, imported when a run names them: :mod:`.r_zero`, :mod:`.agent0`,
:mod:`.absolute_zero`, :mod:`.socratic_zero`.
"""
from __future__ import annotations

from typing import Optional, Sequence

from unifiedplayers.methods.base import (METHODS, GroupShape, Method, NoSettings, build_method, import_builtin_methods,
                                         method_class, parse_settings, register_method)
from unifiedplayers.methods.sources import (REWARD_SOURCES, RewardSource, register_reward_source, reward_source,
                                            self_consistency)
from unifiedplayers.roles import ROLES


def shape_advantages(shapes: dict[int, GroupShape], group_ids: Sequence[int],
                     advantages: Sequence[float]) -> list[tuple[int, float, Optional[float]]]:
    """Apply each group's shape to its samples' GRPO advantages (Eq. 17 first, then the method's shape).

    ``shapes[g]`` is the shape of group ``g`` (a group without one is plain GRPO); ``group_ids[n]`` and
    ``advantages[n]`` belong to sample ``n``. Returns ``(n, adv_scale·Â_n, clip_high)`` for every sample
    of a kept group, in sample order.
    """
    if len(group_ids) != len(advantages):
        raise ValueError(f"{len(group_ids)} group ids for {len(advantages)} advantages")
    out = []
    for n, (g, a) in enumerate(zip(group_ids, advantages)):
        shape = shapes.get(g, GroupShape())
        if shape.keep:
            out.append((n, float(shape.adv_scale) * float(a), shape.clip_high))
    return out


__all__ = ["METHODS", "REWARD_SOURCES", "ROLES", "GroupShape", "Method", "NoSettings", "RewardSource", "build_method",
           "import_builtin_methods", "method_class", "parse_settings", "register_method", "register_reward_source",
           "reward_source", "self_consistency", "shape_advantages"]
