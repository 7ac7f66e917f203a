"""The plan of a run (§3.3, Appendix B.4), a pure function of its config: the blocks of an outer iteration
(:func:`blocks`), cut into sampling phases of S × μ updates (:func:`phase_steps`), what a phase samples
(:func:`phase_calls`), which phase ends save (:func:`save_due`), where a resumed run goes on (:func:`position`) and
the generation seeds. The start-up checks and the capacity plan read it too, so it imports nothing of the loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unifiedplayers.roles import ROLES

BLOCK_ORDER = ROLES  # ("planning", "execution", "evaluation")


def trained_roles(cfg: Any) -> list[str]:
    """The players updated in this run: the method's roles, minus the Table 3 frozen ones."""
    roles = [r for r in BLOCK_ORDER if r in cfg.method.roles] if cfg.method.trainable else []
    if not cfg.schedule.train_planning and "planning" in roles:
        roles.remove("planning")
    if not cfg.schedule.train_evaluation and "evaluation" in roles:
        roles.remove("evaluation")
    return roles


def blocks(cfg: Any) -> list[tuple[str, int]]:
    """The blocks of every outer iteration, in order: (role, updates) of each trained player with updates."""
    sizes = [(role, int(cfg.schedule[f"{role}_updates"])) for role in trained_roles(cfg)]
    return [(role, n) for role, n in sizes if n > 0]


def total_updates(cfg: Any) -> int:
    return int(cfg.schedule.outer_iterations) * sum(n for _, n in blocks(cfg))


def phase_steps(cfg: Any) -> int:
    """Optimizer steps of one sampling phase: S × μ (``schedule.steps_per_generation`` × ``trainer.num_iterations``).
    A block's updates are a multiple of it (:func:`unifiedplayers.checks.check_schedule`)."""
    return int(cfg.schedule.steps_per_generation) * int(cfg.trainer.num_iterations)


@dataclass(frozen=True)
class Update:
    """One update (optimizer step) and its place in the run's loops: its outer iteration (1-based), its block's role,
    its index within the block and within its sampling phase (0 samples the phase), and within the whole run."""

    iteration: int
    role: str
    step_in_block: int
    step_in_phase: int
    index: int

    @property
    def phase_first(self) -> int:
        """The run index of its phase's first update, which names the phase (records, phase.pt)."""
        return self.index - self.step_in_phase


def position(cfg: Any, completed: int) -> tuple[int, int, int, int]:
    """Where a run that completed ``completed`` updates goes on, as the loops' indices of its next update: (outer
    iteration, block, phase in the block, step in the phase); past the end, (outer_iterations + 1, 0, 0, 0)."""
    sizes, per_phase = [n for _, n in blocks(cfg)], phase_steps(cfg)
    if not sizes:
        return int(cfg.schedule.outer_iterations) + 1, 0, 0, 0
    iteration, k = divmod(completed, sum(sizes))
    for b, n in enumerate(sizes):
        if k < n:
            return iteration + 1, b, k // per_phase, k % per_phase
        k -= n
    raise AssertionError("unreachable: k < sum(sizes)")


def seed_for(base: int, update: int, stream: int) -> int:
    """The generation seed of one stream (a generation stage) of one update: a pure function of the run seed and position."""
    return (int(base) * 1_000_003 + int(update) * 7_919 + int(stream) * 104_729) % (2**31 - 1)


def save_due(done: int, block_size: int, per_phase: int, save_every: int) -> bool:
    """Whether the sampling phase (of ``per_phase`` updates) that ends after ``done`` updates of a block of
    ``block_size`` ends with a save: the block's last, and one in which the block's update count reaches a multiple
    of ``save_every`` (<= 0: none inside a block). Saves fall at phase ends (or at a clean stop, which the outer loop
    makes): a save inside a phase would need a second one at its end."""
    return done == block_size or (save_every > 0 and done // save_every > (done - per_phase) // save_every)


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
    """What a phase of ``num_minibatches`` updates training ``role`` samples, as
    :meth:`~unifiedplayers.loop.sampling.PhaseSampler.tasks` samples it (at most: every output of a Planning phase
    played), for the capacity plan (:func:`unifiedplayers.capacity.phase_stages`)."""
    p = player_cfg
    prompts = num_minibatches * p.prompts_per_update
    played = prompts * p.tasks_per_prompt if role == "planning" else num_minibatches * p.tasks_per_update
    calls = [SamplingCall("tasks", prompts, int(p.tasks_per_prompt), int(p.planning_max_new_tokens)),
             SamplingCall("trajectories", played, int(p.num_trajectories), int(p.execution_max_new_tokens),
                          int(execution_config(p, use_tools).max_turns))]
    if writes_verifiers:
        calls.append(SamplingCall("verifiers", played, int(p.num_verifiers), int(p.evaluation_max_new_tokens)))
    return calls
