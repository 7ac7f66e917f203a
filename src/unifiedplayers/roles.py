"""The three players of UnifiedPlayers (§3), in block order: one name each, used everywhere. What each one samples
in a phase is :func:`unifiedplayers.schedule.phase_calls`; how its GRPO groups are made,
:func:`unifiedplayers.loop.phase.group_samples`."""
from __future__ import annotations

ROLES = ("planning", "execution", "evaluation")
