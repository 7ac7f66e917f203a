"""The plan of a run (§3.3, Appendix B.4), a pure function of its config: its updates in block order (Planning →
Execution → Evaluation, ``schedule.<role>_updates`` each per outer iteration), each update's place in its sampling
phase, what a phase samples (:func:`phase_calls`), which updates end with a save (:func:`save_due`) and the
generation seeds. The outer loop (:mod:`unifiedplayers.loop.outer`) runs it; :mod:`unifiedplayers.checks` checks a
config against it before anything is loaded, and :mod:`unifiedplayers.capacity` plans a run's memory from it. It
imports nothing of the loop, so those two read the plan without depending on the loop that calls them.

Names: a *slot* is one planned update (optimizer step); a *phase* is the run of S × μ updates that share one
sample (:mod:`unifiedplayers.loop.phase`), named by the index of its first update."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from unifiedplayers.roles import ROLES, SPECS, spec

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


def save_due(slot: Slot, save_every: int, per_phase: int, saved_phase: Optional[int]) -> bool:
    """Whether update ``slot`` ends with a save: the last update of a block; the end of a sampling phase (of
    ``per_phase`` updates) in which the block's update count reaches a multiple of ``save_every`` (<= 0: none
    inside a block); the end of the phase that the last saved state stops inside (``saved_phase``: a clean stop
    there), so that the next phase's ``phase.pt`` never replaces the one a state names. Only a clean stop saves
    inside a phase: a cadence save there would need a second one at the phase's end."""
    if slot.last_of_block:
        return True
    if slot.step_in_phase != per_phase - 1:
        return False
    done = slot.step_in_block + 1
    return saved_phase == slot.phase_first or (save_every > 0 and done // save_every > (done - per_phase) // save_every)


def execution_config(player_cfg: Any, use_tools: bool) -> Any:
    """The Execution player's settings: a method without tools (R-Zero, Socratic-Zero) gets one generation per
    trajectory, its code never run."""
    from omegaconf import OmegaConf

    return player_cfg if use_tools else OmegaConf.merge(player_cfg, {"max_turns": 1})


@dataclass(frozen=True)
class SamplingCall:
    """One generation call of a phase: ``samples`` of each of ``prompts`` prompts, at most ``max_new_tokens`` a
    turn over ``turns`` turns (a tool output between two)."""

    name: str  # tasks | trajectories | verifiers
    prompts: int
    samples: int
    max_new_tokens: int
    turns: int = 1


def phase_calls(player_cfg: Any, role: str, num_minibatches: int, use_tools: bool,
                writes_verifiers: bool) -> list[SamplingCall]:
    """What a phase of ``num_minibatches`` updates training ``role`` samples, as :class:`~unifiedplayers.loop.sampling.PhaseSampler` samples it:
    one round of Planning prompts (up to player.task_attempts rounds while too few tasks are well-formed), then K
    trajectories and M verifiers for each task played: every well-formed task in a Planning phase (at most all of
    them), ``tasks_per_update`` an update otherwise. The capacity plan reads the same calls
    (:func:`unifiedplayers.capacity.phase_stages`)."""
    p = player_cfg
    prompts = num_minibatches * p.prompts_per_update
    played = prompts * p.tasks_per_prompt if spec(role).plays_every_task else num_minibatches * p.tasks_per_update
    calls = []
    for s in SPECS.values():  # in block order: the tasks first, then what each task is played with
        if s.call == "verifiers" and not writes_verifiers:  # a verdict-free method samples no verifiers (M = 0)
            continue
        turns = int(execution_config(p, use_tools).max_turns) if s.multi_turn else 1
        calls.append(SamplingCall(s.call, prompts if s.grouped_by == "prompt" else played, int(getattr(p, s.samples_key)),
                                  int(getattr(p, s.tokens_key)), turns))
    return calls
