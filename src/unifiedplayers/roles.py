"""The three players of UnifiedPlayers (§3), in block order: one name each, used everywhere."""
from __future__ import annotations

ROLES = ("planning", "execution", "evaluation")
