"""Start-up checks of a run config: a setting the outer loop cannot honour fails here, naming the key, before
any model is loaded or any file written (:func:`validate`)."""
from __future__ import annotations

import dataclasses
from typing import Any

from unifiedplayers import grpo
from unifiedplayers.config import RoleHyperparameters, resolve_player_config, role_temperature, role_trainer_config
from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.methods import Method, build_method
from unifiedplayers.schedule import BLOCK_ORDER, phase_steps, trained_roles

FEEDBACK_MODES = ("fresh", "stale")
RETENTION_MODES = ("all", "weights", "execution_weights")


def validate(cfg: Any, dist: DistContext = SINGLE) -> Method:
    """Fail at start-up on settings the loop cannot honour; the run's method, built and checked."""
    check_ranks(cfg, dist)
    check_schedule(cfg)
    check_trainer_roles(cfg)
    check_sampling(cfg)
    check_players(cfg)
    method = build_method(cfg)
    check_shared_model(cfg, method)
    grpo.get_adv_estimator(cfg.trainer.adv_estimator)
    return method


def check_ranks(cfg: Any, dist: DistContext) -> None:
    """Settings that several ranks (``torchrun``) cannot run."""
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


def check_schedule(cfg: Any) -> None:
    """Block sizes, sampling phases, feedback and retention modes."""
    s = cfg.schedule
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
    if s.feedback not in FEEDBACK_MODES:
        raise ValueError(f"schedule.feedback={s.feedback!r}: fresh | stale")
    if s.checkpoint_retention not in RETENTION_MODES:
        raise ValueError(f"schedule.checkpoint_retention={s.checkpoint_retention!r}: " + " | ".join(RETENTION_MODES))
    if s.outer_iterations < 0 or min(s.planning_updates, s.execution_updates, s.evaluation_updates) < 0:
        raise ValueError("schedule: iteration and update counts must be >= 0")


def check_trainer_roles(cfg: Any) -> None:
    """``trainer.roles``: the schema rejects an unknown role or key in a file or a plain override; Hydra's
    ``+key=`` appends past the schema, so the loop checks again."""
    allowed = {f.name for f in dataclasses.fields(RoleHyperparameters)}
    for role, over in cfg.trainer.roles.items():
        if role not in BLOCK_ORDER:
            raise ValueError(f"trainer.roles.{role}: unknown role; roles: {', '.join(BLOCK_ORDER)}")
        unknown = sorted(set(over.keys()) - allowed)
        if unknown:
            raise ValueError(f"trainer.roles.{role}: unknown key(s) {unknown}; keys: {sorted(allowed)}")


def check_sampling(cfg: Any) -> None:
    """Eq. 18 compares π_θ with the behaviour log-probs recorded at sampling: the trainer must score tokens
    under the distribution they were drawn from (same temperature, no top-p truncation)."""
    for role in BLOCK_ORDER:
        if role_temperature(cfg, role) <= 0:
            raise ValueError(f"the sampling temperature of {role} must be > 0")
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


def check_players(cfg: Any) -> None:
    """Group sizes and the players' prompts."""
    p = resolve_player_config(cfg)
    for name in ("prompts_per_update", "tasks_per_prompt", "tasks_per_update", "task_attempts",
                 "num_trajectories", "num_verifiers", "max_turns"):
        if getattr(p, name) < 1:
            raise ValueError(f"player.{name}={getattr(p, name)}: need >= 1")
    if not p.planning.template or not p.execution.template or not p.evaluation.template:
        raise ValueError("player.<role>.template must be set for all three players (conf/player/)")


def check_shared_model(cfg: Any, method: Method) -> None:
    """A shared model (Absolute Zero) joins two trained players and cannot hold back its own updates."""
    if method.shared_model:
        if not {"planning", "execution"} <= set(trained_roles(cfg)):
            raise ValueError("method.shared_model=true joins the Planning and Execution players: both must be trained")
        if cfg.schedule.feedback == "stale":
            raise ValueError("method.shared_model=true with schedule.feedback=stale: one model cannot hold back its "
                             "own updates from itself; use schedule.feedback=fresh")
