"""The plan of a run (SPEC §7, Appendix B.4): its updates in block order, each update's place in its
sampling phase, the generation seeds, and the start-up checks of a config (:func:`validate`), so that a
setting the loop cannot honour fails before any model is loaded. :mod:`unifiedplayers.schedule` runs it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from unifiedplayers import grpo
from unifiedplayers.config import RoleHyperparameters, resolve_player_config, role_temperature, role_trainer_config
from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.methods import ROLES, method_reward_sources
from unifiedplayers.players.execution import code_requests

BLOCK_ORDER = ROLES  # ("planning", "execution", "evaluation")
FEEDBACK_MODES = ("fresh", "stale")
RETENTION_MODES = ("all", "weights", "execution_weights")


@dataclass(frozen=True)
class Slot:
    """One update (optimizer step) of the run: global index, outer iteration (1-based), role, index within
    its block; and its place in its sampling phase (:mod:`unifiedplayers.phase`): the phase's first update
    and this step's index within the phase (0 samples the phase)."""

    index: int
    iteration: int
    role: str
    update: int
    block_size: int
    phase: int  # the global index of its phase's first update (the slot itself when S = μ = 1)
    step_in_phase: int = 0

    @property
    def first_of_phase(self) -> bool:
        return self.step_in_phase == 0

    @property
    def first_of_block(self) -> bool:
        return self.update == 0

    @property
    def last_of_block(self) -> bool:
        return self.update == self.block_size - 1


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
                slots.append(Slot(len(slots), it, role, u, n, phase=first, step_in_phase=u % per_phase))
    return slots


def phase_steps(cfg: Any) -> int:
    """Optimizer steps of one sampling phase: S × μ (``schedule.steps_per_generation`` × ``trainer.num_iterations``)."""
    return int(cfg.schedule.steps_per_generation) * int(cfg.trainer.num_iterations)


def seed_for(base: int, update: int, stage: int) -> int:
    """The generation seed of one stage of one update: a pure function of the run seed and position."""
    return (int(base) * 1_000_003 + int(update) * 7_919 + int(stage) * 104_729) % (2**31 - 1)


def validate(cfg: Any, dist: DistContext = SINGLE) -> None:
    """Fail at start-up on settings the loop cannot honour."""
    if dist.enabled and cfg.rollout.backend == "vllm" and (cfg.rollout.tensor_parallel_size != 1
                                                           or not cfg.rollout.inprocess):
        raise NotImplementedError(
            f"rollout=vllm over {dist.world_size} ranks runs one in-process engine per rank on the rank's own "
            "GPU: needs rollout.tensor_parallel_size=1 and rollout.inprocess=true")
    if dist.enabled and cfg.trainer.backend == "deepspeed_zero3":
        # ZeRO-3 gathers the partitioned weights in every forward, a collective: the ranks would have to
        # generate in lockstep, but each samples its own share, of its own lengths.
        if cfg.rollout.backend == "hf":
            raise NotImplementedError(
                f"trainer=deepspeed_zero3 with rollout=hf over {dist.world_size} ranks is not supported: hf "
                "generation from ZeRO-3 partitions gathers them in every forward, in lockstep over the ranks, "
                "which the ranks' different samples break; use rollout=vllm (its own weight copy per rank) or "
                "trainer=deepspeed_zero2")
        if cfg.schedule.feedback == "stale":
            raise NotImplementedError(
                f"schedule.feedback=stale with trainer=deepspeed_zero3 over {dist.world_size} ranks is not "
                "supported (the published snapshot copies the module, whose ZeRO-3 parameters are partitions); "
                "use trainer=deepspeed_zero2 or trainer=torch")
    s, p = cfg.schedule, resolve_player_config(cfg)
    if s.steps_per_generation < 1 or cfg.trainer.num_iterations < 1:
        raise ValueError(f"schedule.steps_per_generation={s.steps_per_generation} and trainer.num_iterations="
                         f"{cfg.trainer.num_iterations}: need >= 1")
    per_phase = phase_steps(cfg)
    for role in BLOCK_ORDER:
        n = getattr(s, f"{role}_updates")
        if n % per_phase:
            raise ValueError(
                f"schedule.{role}_updates={n} is not a multiple of schedule.steps_per_generation × "
                f"trainer.num_iterations = {s.steps_per_generation} × {cfg.trainer.num_iterations}: a sampling "
                "phase would straddle two blocks")
    # The schema rejects an unknown role or key in a file or a plain override; Hydra's `+key=` appends past
    # the schema, so the loop checks again.
    allowed = {f.name for f in dataclasses.fields(RoleHyperparameters)}
    for role, over in cfg.trainer.roles.items():
        if role not in BLOCK_ORDER:
            raise ValueError(f"trainer.roles.{role}: unknown role; roles: {', '.join(BLOCK_ORDER)}")
        unknown = sorted(set(over.keys()) - allowed)
        if unknown:
            raise ValueError(f"trainer.roles.{role}: unknown key(s) {unknown}; keys: {sorted(allowed)}")
    for role in BLOCK_ORDER:
        if role_temperature(cfg, role) <= 0:
            raise ValueError(f"the sampling temperature of {role} must be > 0")
    # Eq. 18 compares π_θ with the behaviour log-probs recorded at sampling: the trainer must score tokens
    # under the distribution they were drawn from (same temperature, no top-p truncation).
    for role in trained_roles(cfg):
        sampled, scored = role_temperature(cfg, role), float(role_trainer_config(cfg.trainer, role).temperature)
        if sampled != scored:
            raise ValueError(
                f"{role} samples at temperature {sampled} (rollout.temperature or trainer.roles.{role}.temperature) "
                f"but its trainer scores tokens at {scored} (trainer.temperature): the ratio of Eq. 18 would be off 1 "
                "before any update. Set them equal (trainer.roles.<role>.temperature sets both)")
    if trained_roles(cfg) and cfg.rollout.top_p != 1.0:
        raise ValueError(f"rollout.top_p={cfg.rollout.top_p}: the trainer recomputes log-probs without top-p "
                         "truncation, so training needs rollout.top_p=1.0 (the ratio of Eq. 18 would be off 1)")
    if s.feedback not in FEEDBACK_MODES:
        raise ValueError(f"schedule.feedback={s.feedback!r}: fresh | stale")
    if s.checkpoint_retention not in RETENTION_MODES:
        raise ValueError(f"schedule.checkpoint_retention={s.checkpoint_retention!r}: " + " | ".join(RETENTION_MODES))
    if s.outer_iterations < 0 or min(s.planning_updates, s.execution_updates, s.evaluation_updates) < 0:
        raise ValueError("schedule: iteration and update counts must be >= 0")
    for name in ("prompts_per_update", "tasks_per_prompt", "tasks_per_update", "task_attempts",
                 "num_trajectories", "num_verifiers", "max_turns"):
        if getattr(p, name) < 1:
            raise ValueError(f"player.{name}={getattr(p, name)}: need >= 1")
    if not p.planning.template or not p.execution.template or not p.evaluation.template:
        raise ValueError("player.<role>.template must be set for all three players (conf/player/)")
    if getattr(cfg.method, "shared_model", False):
        if not {"planning", "execution"} <= set(trained_roles(cfg)):
            raise ValueError("method.shared_model=true joins the Planning and Execution players: both must be trained")
        if s.feedback == "stale":
            raise ValueError("method.shared_model=true with schedule.feedback=stale: one model cannot hold back its "
                             "own updates from itself; use schedule.feedback=fresh")
    code_tasks = str((cfg.method.extra or {}).get("task_format", "math")) == "code_reasoning"
    if code_tasks:
        from unifiedplayers.methods.absolute_zero import check_task_types

        check_task_types(p.topics)  # an unknown Absolute Zero task type fails here, not in the first phase
    # (Absolute Zero's solver prompt shows programs to reason about: code in its prompt is the task itself.)
    if not cfg.method.use_tools and not code_tasks and code_requests(p):
        raise ValueError(
            f"method {cfg.method.name} runs without tools, but the Execution prompt asks for code "
            f"({', '.join(code_requests(p))}): every sample that obeyed would end unanswered. Give it a "
            "plain-text player.execution prompt (system, template, few_shot), as conf/method/r_zero.yaml does")
    method_reward_sources(cfg.method)
    grpo.get_adv_estimator(cfg.trainer.adv_estimator)
