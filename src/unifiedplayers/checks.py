"""Start-up checks of a run config: a setting the outer loop cannot honour fails here, naming the key, before
any model is loaded or any file written (:func:`validate`)."""
from __future__ import annotations

import dataclasses
from typing import Any

from unifiedplayers.trainer import grpo
from unifiedplayers.config import (RoleHyperparameters, did_you_mean, resolve_player_config, role_temperature,
                                   role_trainer_config)
from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.machine import check_gpu_usable
from unifiedplayers.methods import Method, build_method
from unifiedplayers.schedule import BLOCK_ORDER, phase_steps, trained_roles

FEEDBACK_MODES = ("fresh", "stale")
RETENTION_MODES = ("all", "weights", "execution_weights")


def validate(cfg: Any, dist: DistContext = SINGLE) -> Method:
    """Fail at start-up on settings the loop cannot honour; the run's method, built and checked."""
    check_trainer_roles(cfg)  # first: an unknown role is named as a role
    check_known_keys(cfg)
    check_gpu_usable(str(cfg.model.device))  # a GPU that torch cannot use (its CUDA against the driver), named
    check_ranks(cfg, dist)
    check_library_versions(cfg)
    check_ranges(cfg)
    check_precision(cfg)
    check_schedule(cfg)
    check_sampling(cfg)
    check_players(cfg)
    check_adapters(cfg)
    method = build_method(cfg)
    check_shared_model(cfg, method)
    grpo.get_adv_estimator(cfg.trainer.adv_estimator)
    check_capacity(cfg, dist)  # last: the settings are valid, now whether they fit this machine
    return method


def check_capacity(cfg: Any, dist: DistContext = SINGLE) -> None:
    """The run's capacity plan against the node this rank is on (``unifiedplayers.capacity.check_fits``); every rank
    checks, so every node is. Skipped with ``capacity.check=false`` and for a GPU run on a machine without a GPU (it
    stops at its model load anyway); a backbone whose shapes the plan cannot tell is let through, with a warning."""
    import warnings

    from unifiedplayers.capacity import UnknownArchitecture, check_fits, hardware_here, plan

    if not cfg.get("capacity", {}).get("check", True):
        return
    machine = hardware_here(cfg, dist.world_size, cfg.get("run_dir"))
    if str(cfg.model.device).startswith("cuda") and machine.gpu_memory == 0:
        return
    try:
        the_plan = plan(cfg, machine)
    except UnknownArchitecture as err:
        warnings.warn(f"{err}; the run starts without a capacity check", stacklevel=2)
        return
    check_fits(the_plan, machine)


def check_known_keys(cfg: Any) -> None:
    """Every key of the config is one of the typed schema's (Hydra's ``+key=value`` appends past the schema)."""
    from omegaconf import DictConfig, OmegaConf

    from unifiedplayers.config import typed_schema

    def walk(node: Any, schema: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig) or not isinstance(schema, DictConfig):
            return
        if not dataclasses.is_dataclass(OmegaConf.get_type(schema)):
            return  # a free-form mapping (method.extra, trainer.roles): checked where it is read
        for key in node.keys():
            name = f"{prefix}{key}"
            if key not in schema.keys():
                raise ValueError(f"{name}: unknown key{did_you_mean(str(key), [str(k) for k in schema.keys()])}; "
                                 f"the keys of {prefix[:-1] or 'the config'}: {sorted(str(k) for k in schema.keys())}")
            walk(node._get_node(key), schema._get_node(key), name + ".")

    walk(cfg, typed_schema(), "")


def check_precision(cfg: Any) -> None:
    """Dtype settings (``auto`` or a dtype), and the combinations the trainer cannot honour: float16 without
    DeepSpeed's loss scaling."""
    from unifiedplayers.precision import check_setting

    check_setting("model.dtype", cfg.model.dtype)
    check_setting("trainer.dtype", cfg.trainer.dtype)
    if cfg.trainer.dtype == "float16" and cfg.trainer.backend == "torch":
        raise ValueError("trainer.dtype=float16 with trainer.backend=torch: float16 training needs loss scaling, which "
                         "only the DeepSpeed backends do; use trainer.dtype=bfloat16 (or auto)")
    if str(cfg.rollout.prefix_cache).lower() not in ("auto", "true", "false"):
        raise ValueError(f"rollout.prefix_cache={cfg.rollout.prefix_cache!r}: need auto, true or false")


def check_ranges(cfg: Any) -> None:
    """Values that are accepted by type but give meaningless runs."""
    sb = cfg.sandbox
    if not sb.timeout_s > 0:
        raise ValueError(f"sandbox.timeout_s={sb.timeout_s}: need > 0 (seconds per sandbox call; default 10)")
    if not sb.wall_timeout_factor >= 1:
        raise ValueError(f"sandbox.wall_timeout_factor={sb.wall_timeout_factor}: need >= 1 (the wall-clock cap of a "
                         "call, in multiples of its CPU-time limit sandbox.timeout_s; default 3)")
    if sb.memory_mb < 32:
        raise ValueError(f"sandbox.memory_mb={sb.memory_mb}: need >= 32 (the interpreter of a call needs about "
                         "32 MB; default 512)")
    if sb.max_processes < 1:
        raise ValueError(f"sandbox.max_processes={sb.max_processes}: need >= 1")
    if cfg.trainer.entropy_every < 0:
        raise ValueError(f"trainer.entropy_every={cfg.trainer.entropy_every}: need >= 0 (0: the entropy bank scored at "
                         "each block's start and end only; n > 0: also after every n-th update)")
    for role in trained_roles(cfg):
        t = role_trainer_config(cfg.trainer, role)
        for key, ok, need in (("lr", t.lr >= 0, ">= 0 (a negative rate ascends the loss)"),
                              ("clip_eps", t.clip_eps > 0, "> 0 (ε_clip of Eq. 19; default 0.2)"),
                              ("micro_batch_size", t.micro_batch_size >= 1, ">= 1"),
                              ("grad_accum_steps", t.grad_accum_steps >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"trainer.{key} (or trainer.roles.{role}.{key})={getattr(t, key)}: need {need}")
        budget = getattr(t, "max_tokens_per_micro_batch", None)
        if budget is not None and not budget > 0:
            raise ValueError(f"trainer.max_tokens_per_micro_batch={budget}: need > 0 tokens, or null for "
                             "micro_batch_size samples a micro-batch")
        if budget is not None and t.grad_accum_steps > 0:
            raise ValueError(f"trainer.max_tokens_per_micro_batch={budget} and trainer.grad_accum_steps="
                             f"{t.grad_accum_steps} both split the batch: set one")


def check_library_versions(cfg: Any) -> None:
    """A DeepSpeed backend (of any role) with a DeepSpeed outside its tested window fails before any model load."""
    backends = {cfg.trainer.backend} | {r.get("backend") for r in (cfg.trainer.get("roles") or {}).values() if r}
    if any(str(b).startswith("deepspeed") for b in backends if b):
        from unifiedplayers.trainer.deepspeed_backend import check_deepspeed_version

        check_deepspeed_version()


def check_ranks(cfg: Any, dist: DistContext) -> None:
    """Settings that several ranks (``torchrun``) cannot run (the rollout engine's own: its ``check_ranks``)."""
    if not dist.enabled:
        return
    from unifiedplayers.rollout import engine_class

    engine = engine_class(cfg.rollout)  # its module, not its library
    if getattr(engine, "check_ranks", None) is not None:
        engine.check_ranks(cfg.rollout, dist.world_size)
    if cfg.trainer.backend == "deepspeed_zero3":
        if getattr(engine, "samples_from_module", False):
            backend = cfg.rollout.backend
            raise NotImplementedError(
                f"trainer=deepspeed_zero3 with rollout={backend} over {dist.world_size} ranks is not supported: "
                f"{backend} generation from ZeRO-3 partitions gathers them in every forward, in lockstep over the "
                "ranks, which the ranks' different samples break; use rollout=vllm (its own weight copy per rank) "
                "or trainer=deepspeed_zero2")
        if cfg.schedule.feedback == "stale":
            raise NotImplementedError(f"schedule.feedback=stale with trainer=deepspeed_zero3 over {dist.world_size} "
                                      "ranks is not supported (the published snapshot copies the module, whose ZeRO-3 "
                                      "parameters are partitions); use trainer=deepspeed_zero2 or trainer=torch")


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


def check_adapters(cfg: Any) -> None:
    """``trainer.lora`` and ``rollout.sleep_level``: values in range, and the combinations that cannot run."""
    lora = cfg.trainer.lora
    if lora.rank < 0:
        raise ValueError(f"trainer.lora.rank={lora.rank}: need >= 0 (0: every parameter trained)")
    if lora.rank > 0 and (not lora.alpha > 0 or not 0 <= lora.dropout < 1 or not lora.target_modules):
        raise ValueError(f"trainer.lora: alpha={lora.alpha} (need > 0), dropout={lora.dropout} (need in [0, 1)), "
                         f"target_modules={list(lora.target_modules)} (need at least one)")
    if lora.rank > 0 and str(cfg.trainer.backend) == "deepspeed_zero3":
        frozen = [r for r in BLOCK_ORDER if r not in trained_roles(cfg)]
        if cfg.trainer.ref_mode != "precompute" or frozen or cfg.schedule.feedback != "fresh":
            raise ValueError(
                "trainer.lora.rank > 0 with trainer.backend=deepspeed_zero3: the trained players' engines partition the "
                "backbone every player shares, so a module outside them (pi_ref as a copy, a frozen player "
                f"{frozen or ''}, stale feedback's published copy) would hold empty partitions; needs "
                "trainer.ref_mode=precompute, every player trained and schedule.feedback=fresh (or trainer=deepspeed_zero2)")
    level = int(cfg.rollout.sleep_level)
    if level not in (0, 1, 2):
        raise ValueError(f"rollout.sleep_level={level}: 0 (never), 1 (weights to the host) or 2 (weights dropped)")
    if level and str(cfg.rollout.backend) != "vllm":
        raise ValueError(f"rollout.sleep_level={level}: only rollout=vllm sleeps (the hf engine samples from the "
                         "trainer's own weights and holds no cache between calls); set it to 0")
    if level == 2 and lora.rank > 0:
        raise ValueError("rollout.sleep_level=2 drops the engine's weights, and adapter players (trainer.lora.rank "
                         "> 0) never copy the backbone in again: use rollout.sleep_level=1")


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
