"""The schedule of a run (§3.3, Appendix B.4): its updates in block order (Planning → Execution → Evaluation,
``schedule.<role>_updates`` each per outer iteration), each update's place in its sampling phase, and the
generation seeds. The outer loop (:mod:`unifiedplayers.loop.outer`) runs it; :mod:`unifiedplayers.checks` checks a
config before anything is loaded.

Names: a *slot* is one planned update (optimizer step); a *phase* is the run of S × μ updates that share one
sample (:mod:`unifiedplayers.loop.phase`), named by the index of its first update."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unifiedplayers.roles import ROLES

BLOCK_ORDER = ROLES  # ("planning", "execution", "evaluation")


@dataclass(frozen=True)
class Slot:
    """One update (optimizer step) of the run: global index, outer iteration (1-based), role, index within
    its block (``step_in_block``); and its place in its sampling phase (:mod:`unifiedplayers.loop.phase`): the phase's first update
    and this step's index within the phase (0 samples the phase)."""

    index: int
    iteration: int
    role: str
    step_in_block: int  # its index within its block (0 starts the block)
    block_size: int
    phase_first: int  # the global index of its phase's first update (the slot itself when S = μ = 1)
    step_in_phase: int = 0

    @property
    def first_of_phase(self) -> bool:
        return self.step_in_phase == 0

    @property
    def first_of_block(self) -> bool:
        return self.step_in_block == 0

    @property
    def last_of_block(self) -> bool:
        return self.step_in_block == self.block_size - 1


def trained_roles(cfg: Any) -> list[str]:
    """The players updated in this run: the method's roles, minus the Table 3 frozen ones."""
    roles = [r for r in BLOCK_ORDER if r in cfg.method.roles] if cfg.method.trainable else []
    if not cfg.schedule.train_planning and "planning" in roles:
        roles.remove("planning")
    if not cfg.schedule.train_evaluation and "evaluation" in roles:
        roles.remove("evaluation")
    return roles


def plan_updates(cfg: Any) -> list[Slot]:
    """Every update of the run in order; blocks of untrained players are empty."""
    sizes = {
        "planning": cfg.schedule.planning_updates,
        "execution": cfg.schedule.execution_updates,
        "evaluation": cfg.schedule.evaluation_updates,
    }
    roles = trained_roles(cfg)
    per_phase = phase_steps(cfg)
    slots: list[Slot] = []
    for it in range(1, cfg.schedule.outer_iterations + 1):
        for role in BLOCK_ORDER:
            n = sizes[role] if role in roles else 0
            for u in range(n):
                first = len(slots) - u % per_phase
                slots.append(Slot(len(slots), it, role, u, n, phase_first=first, step_in_phase=u % per_phase))
    return slots


def phase_steps(cfg: Any) -> int:
    """Optimizer steps of one sampling phase: S × μ (``schedule.steps_per_generation`` × ``trainer.num_iterations``)."""
    return int(cfg.schedule.steps_per_generation) * int(cfg.trainer.num_iterations)


def seed_for(base: int, update: int, stream: int) -> int:
    """The generation seed of one stream (a generation stage) of one update: a pure function of the run seed and position."""
    return (int(base) * 1_000_003 + int(update) * 7_919 + int(stream) * 104_729) % (2**31 - 1)
