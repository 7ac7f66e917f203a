"""The three players of UnifiedPlayers (§3), in block order: one name each, used everywhere, and each one's shape
defined once (:data:`SPECS`): what it samples in a phase, how many per prompt, at what budget, and how its GRPO
groups are made. Sampling (:func:`unifiedplayers.schedule.phase_calls`, which the sampler and the capacity plan
both read), the minibatches (:mod:`unifiedplayers.loop.phase`) and the seeds read it from here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ROLES = ("planning", "execution", "evaluation")


@dataclass(frozen=True)
class RoleSpec:
    """One player's shape (Appendix B.3-B.4)."""

    name: str
    call: str  # its generation call in a phase: tasks | trajectories | verifiers
    samples_key: str  # player.<key>: samples of one prompt (G_T tasks, K trajectories, M verifiers)
    tokens_key: str  # player.<key>: the max_new_tokens of one generation (a turn, for a multi-turn one)
    stream: int  # its seed stream (a phase's call seed: schedule.seed_for(seed, phase, stream) + its first sample)
    # "prompt": a GRPO group is the G_T outputs of one questioner prompt, malformed ones included, and a phase that
    # trains this player plays every well-formed task; "task": a group is the samples of one played task
    grouped_by: str
    played_samples: Optional[str] = None  # grouped by task: the PlayedTask field that holds them
    multi_turn: bool = False  # its samples are tool-loop trajectories (segments; player.max_turns turns)

    @property
    def plays_every_task(self) -> bool:
        """A phase that trains this player plays every well-formed task (up to all of a round)."""
        return self.grouped_by == "prompt"


SPECS = {
    "planning": RoleSpec("planning", "tasks", "tasks_per_prompt", "planning_max_new_tokens", 10, "prompt"),
    "execution": RoleSpec("execution", "trajectories", "num_trajectories", "execution_max_new_tokens", 20, "task",
                          "rollouts", multi_turn=True),
    "evaluation": RoleSpec("evaluation", "verifiers", "num_verifiers", "evaluation_max_new_tokens", 30, "task",
                           "verifiers"),
}


def spec(role: str) -> RoleSpec:
    """The shape of ``role``; an unknown name fails with the known ones."""
    try:
        return SPECS[role]
    except KeyError:
        raise KeyError(f"unknown role {role!r}: one of {', '.join(ROLES)}") from None
