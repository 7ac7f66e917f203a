"""The outer loop of UnifiedPlayers (SPEC §7, Appendix B.4): Planning -> Execution -> Evaluation blocks.

This module is the only place that knows the block order, fresh and stale feedback, and which player is
frozen. One outer iteration is a Planning block, an Execution block and an Evaluation block; a block is
``schedule.<role>_updates`` GRPO updates (optimizer steps) of its player only.

A block is cut into sampling phases (:mod:`unifiedplayers.phase`; §3.3, Appendix B.3) of S × μ updates
(``schedule.steps_per_generation`` × ``trainer.num_iterations``; 1 × 1 by default). One phase
(:meth:`OuterLoop._sample_phase`), with the policies as they stand at its start:

1. tasks from the Planning player (Planning block: S × ``prompts_per_update`` questioner prompts × G_T
   tasks; other blocks: sampled until S × ``tasks_per_update`` are well-formed);
2. K trajectories per task from the Execution player (tool loop) and M verifiers per task from the
   Evaluation player;
3. the P perturbations of every trajectory; 4. the verdict matrix of every task (sandbox);
5. every role's rewards (:func:`unifiedplayers.rewards.task_rewards`, then the reward source the method
   names, :mod:`unifiedplayers.methods`); R(q) against the question history as it stood at the start of
   the block (held fixed within a block; the block's questions join it at the block end);
6. the active player's GRPO groups (Planning: the G_T tasks of one prompt; Execution: the K trajectories
   of a task; Evaluation: the M verifiers of a task), split into S disjoint units (mini-batches), with
   advantages within each group (Eq. 17);
7. the interaction records of the whole phase (one per Planning output, malformed ones included).

Then each update of the phase (:meth:`OuterLoop._train_step`) is one optimizer step on one unit (μ passes
over the S units in order) against the behaviour log-probs recorded at sampling, followed by a metrics
line, the active player's checkpoint and the run state, in that order.

Feedback (``schedule.feedback``): *fresh*: a co-player samples with its latest weights; *stale*: with
its weights at the start of the outer iteration (its updates are held back until the next iteration).
The active player samples with its weights at the start of the phase (its behaviour policy π_old). ``train_planning`` /
``train_evaluation`` false: that player is never updated (its block is skipped) and keeps the
backbone's weights. Each record's ``meta.checkpoints`` names the checkpoint (player, outer iteration,
update step) of every player that produced it; ``outer_iteration`` 0 and ``step`` 0 are the backbone.

Reference policies: every trainer's π_ref is reset at the start of every outer iteration.

Several ranks (``torchrun --nproc_per_node=N -m unifiedplayers.train``; :mod:`unifiedplayers.distributed`):
every rank runs this loop in lockstep with its own rollout engine and sandbox. Each generation call is
split over the ranks (each draws its share of the samples per prompt, seeded with its rank; rank 0's
seeds are the single-process ones) and gathered in rank order; rank 0 alone perturbs, builds the verdict
matrices, computes rewards and advantages, and writes records, metrics, checkpoints, state and summary;
it broadcasts the update's batch, and the update is data-parallel over all ranks. Whatever is a
collective under the trainer backend happens on every rank at the same point: checkpoint saves (DeepSpeed
writes each rank's optimizer partition), and under ZeRO-3 every read of the full weights (the reference
copy, the weights copied into a rank's vLLM engine, published snapshots). With one rank nothing of this
happens.

Diagnostic pool (SPEC §8, ``schedule.execution_pool``): after every ``every``-th Execution update the
Execution player answers a fixed pool of math and general questions greedily
(:mod:`unifiedplayers.execution_pool`); the accuracies go into that update's metrics line and
``execution_pool.jsonl``, and the summary gets the negative-step rate and the maximum drop. The
evaluation leaves the RNG states as it found them, so a run with the pool on trains exactly as one
without it.

Resume: after every update the run state (position, RNG states, question history, topic counter,
record and metrics line counts, checkpoint paths) is written atomically to ``state.pt``, after the
active player's checkpoint (two alternating slots per player inside a block, a named checkpoint at the
block end, so the state always points at a complete checkpoint). With S × μ > 1, a phase's sampled units
are saved to ``phase.pt`` once sampled, and the state names that phase, so a run stopped inside a phase
trains on the same units when resumed. A resumed run truncates ``records.jsonl`` and ``metrics.jsonl`` to
the counted lines, reloads the checkpoints and goes on from the next update; every generation is seeded
from (seed, the phase's first update, stage), so the result equals an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from unifiedplayers.config import resolve_player_config, role_temperature, role_trainer_config
from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.entropy_bank import entropy_bank_texts
from unifiedplayers.engines import PolicyPool, SamplingTemperature, TimedSandbox  # noqa: F401 (re-exported)
from unifiedplayers.execution_pool import FixedPool, metrics_of
from unifiedplayers.logging import RunLogger, progress, truncate_lines
from unifiedplayers.methods import TaskFeedback, group_shape, method_loop, method_reward_sources, \
    planning_rewards, task_builder
from unifiedplayers.perturbation import PerturbationEngine
from unifiedplayers.players.evaluation import evaluation_prompt, write_verifiers
from unifiedplayers.players.execution import execution_prompt, solve
from unifiedplayers.players.planning import PlanningTask, generate_tasks, planning_prompt
from unifiedplayers.records import RECORDS_FILENAME, RecordWriter
from unifiedplayers.rewards import QuestionHistory, task_rewards
from unifiedplayers.run_state import atomic_torch_save, is_schema_default, result_config
from unifiedplayers.plan import BLOCK_ORDER, Slot, phase_steps, plan_updates, \
    seed_for, trained_roles, validate  # noqa: F401 (re-exported: the plan is part of the loop's interface)
from unifiedplayers.phase import PHASE_FILE, Phase, Unit, group_samples, phase_records, split_units, training_batch, \
    trainer_metrics_line, unit_metrics, unit_of_step
from unifiedplayers.trainer import build_trainer, capture_rng_state, restore_rng_state
from unifiedplayers.verdict import verdict_matrix

STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
EventHook = Callable[[str, "OuterLoop", "Slot"], None]


class StopRun(Exception):
    """Raised by a hook to end the process cleanly after a completed update (the run stays resumable)."""


# --------------------------------------------------------------------------------------------------
# Players


def version(role: str, outer_iteration: int, step: int) -> dict[str, Any]:
    """The name of a player's checkpoint: (player, outer iteration that produced it, update step)."""
    return {"player": role, "outer_iteration": int(outer_iteration), "step": int(step)}


@dataclass
class Player:
    """One player's weights, its trainer (None when frozen) and the name of its current checkpoint."""

    role: str
    model: Any
    trainer: Any = None
    version: Optional[dict[str, Any]] = None
    published_model: Any = None  # stale feedback: the weights at the start of the outer iteration
    published_version: Optional[dict[str, Any]] = None


class _NoLogger:
    """The metrics sink of ranks other than 0 (rank 0 writes metrics.jsonl and W&B)."""

    def log(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------------
# The loop


class OuterLoop:
    """Runs (or resumes) one UnifiedPlayers run in ``run_dir``.

    ``hooks``: callables ``hook(event, loop, slot)`` for events ``"update_end"`` and ``"block_end"``
    (after the state is written); raising :class:`StopRun` ends the process cleanly.
    ``backbone``: an already loaded ``(model, tokenizer)`` (tests); by default ``load_model(cfg.model)``.
    ``rollout_factory``: ``(rollout_cfg, model, tokenizer) -> engine`` in place of ``build_rollout``
    (tests drive the players with scripted text through it).
    ``dist``: this process's rank (:func:`unifiedplayers.distributed.init_distributed`); one rank by default.
    """

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, hooks: Sequence[EventHook] = (),
                 backbone: Optional[tuple[Any, Any]] = None,
                 rollout_factory: Optional[Callable[..., Any]] = None, dist: DistContext = SINGLE) -> None:
        validate(cfg, dist)
        self.dist = dist
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.hooks = list(hooks)
        self._backbone = backbone
        self._rollout_factory = rollout_factory
        self.slots = plan_updates(cfg)
        # Execution updates done once slot i is complete (the diagnostic pool's checkpoint index).
        self.execution_steps = list(np.cumsum([s.role == "execution" for s in self.slots]).tolist())
        self.fixed_pool: Optional[FixedPool] = None
        self.trained = trained_roles(cfg)
        # method.shared_model (Absolute Zero): the Planning and Execution roles are one model and trainer.
        self.shared_roles = (["planning", "execution"] if getattr(cfg.method, "shared_model", False) else [])
        self.reward_sources = method_reward_sources(cfg.method)
        self.build_task = task_builder(cfg.method)  # Planning output -> task (math, or Absolute Zero's code tasks)
        # A baseline's own loop (Socratic-Zero: the Teacher's curriculum, DPO pairs, imitation); None for the others.
        self.method_loop = method_loop(cfg)
        # The player settings with the per-role group sizes and token budgets of trainer.roles set over them.
        self.player_cfg = resolve_player_config(cfg)
        # A method without tools (R-Zero, Socratic-Zero): one generation per trajectory, its code never run.
        self.execution_cfg = (self.player_cfg if cfg.method.use_tools
                              else OmegaConf.merge(self.player_cfg, {"max_turns": 1}))
        self.players: dict[str, Player] = {}
        # R(q)'s question history, held fixed within a block (§3.3); the block's questions join it at its end.
        self.history = QuestionHistory(cfg.reward.repetition_history)
        self.block_questions: list[str] = []
        self.phase: Optional[Phase] = None  # the sampling phase in progress
        self.prompt_counter = 0
        self.completed = 0
        self.records_count = 0
        self.metrics_count = 0
        self.checkpoints: dict[str, Optional[str]] = {r: None for r in BLOCK_ORDER}
        self.published: dict[str, Optional[str]] = {r: None for r in BLOCK_ORDER}
        self.finished = False
        self.wandb_id: Optional[str] = None
        self.timing = {"generation_s": 0.0, "sandbox_s": 0.0, "update_s": 0.0, "checkpoint_s": 0.0, "model_load_s": 0.0,
                       "pool_s": 0.0}

    # ------------------------------------------------------------------ state
    @property
    def state_path(self) -> Path:
        return self.run_dir / STATE_FILE

    def _state(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "records": self.records_count,
            "metrics": self.metrics_count,
            "checkpoints": dict(self.checkpoints),
            "published": dict(self.published),
            "versions": {r: p.version for r, p in self.players.items()},
            "published_versions": {r: p.published_version for r, p in self.players.items()},
            "question_history": list(self.history),
            "block_questions": list(self.block_questions),
            "phase": self.phase.first if self.phase is not None else None,
            "prompt_counter": self.prompt_counter,
            "rng": capture_rng_state(),
            "finished": self.finished,
            "total_updates": len(self.slots),
            "wandb_id": self.wandb_id,
            "world_size": self.dist.world_size,
            "timing": dict(self.timing),
            "method_loop": self.method_loop.state_dict() if self.method_loop is not None else None,
            "config": result_config(self.cfg),
        }

    def _write_state(self) -> None:
        if self.dist.is_main:
            atomic_torch_save(self._state(), self.state_path)

    def _check_resumable(self, state: dict[str, Any]) -> None:
        if state.get("world_size", 1) != self.dist.world_size:
            raise ValueError(
                f"{self.run_dir} holds a run of {state.get('world_size', 1)} rank(s); resume it with as many "
                f"(this process has {self.dist.world_size}): each rank's sampling seeds depend on the rank count")
        now, then = result_config(self.cfg), state["config"]
        diff = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k)
                      and not (k not in then and is_schema_default(k, now[k])))
        if diff:
            shown = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in diff[:8])
            raise ValueError(
                f"{self.run_dir} holds a run with a different config ({shown}{' ...' if len(diff) > 8 else ''}); "
                "resume it with the same settings, or start a fresh run in another run_dir"
            )

    # ------------------------------------------------------------------ setup
    def _load_backbone(self) -> tuple[Any, Any]:
        if self._backbone is not None:
            return self._backbone
        from unifiedplayers.models import load_model

        t = time.perf_counter()
        out = load_model(self.cfg.model)
        self.timing["model_load_s"] += time.perf_counter() - t
        return out

    def _entropy_bank(self, role: str) -> list[list[int]]:
        """The role's first ``entropy_bank_size`` held-out contexts (SPEC §8), rendered with its own prompt."""
        p = self.player_cfg
        size = int(role_trainer_config(self.cfg.trainer, role).entropy_bank_size)
        render = {"planning": planning_prompt, "execution": execution_prompt, "evaluation": evaluation_prompt}[role]
        texts = [render(self.tokenizer, p, item) for item in entropy_bank_texts(role, size)]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def _setup_players(self) -> None:
        model, self.tokenizer = self._load_backbone()
        for i, role in enumerate(BLOCK_ORDER):
            if role in self.shared_roles[1:]:  # method.shared_model: the first shared role's model and trainer
                first = self.players[self.shared_roles[0]]
                self.players[role] = Player(role, first.model, trainer=first.trainer, version=first.version)
                continue
            # All three players start from the same backbone, as separate parameters (SPEC §1).
            m = model if i == len(BLOCK_ORDER) - 1 else copy.deepcopy(model)
            m.eval()
            player = Player(role, m, version=version(role, 0, 0))
            if role in self.trained:
                player.trainer = build_trainer(
                    role_trainer_config(self.cfg.trainer, role), m, role=role, entropy_bank=self._entropy_bank(role) or None,
                    pad_token_id=self.tokenizer.pad_token_id or 0, dist=self.dist,
                )
                player.model = player.trainer.model
                player.model.eval()
            self.players[role] = player
        self.pool = PolicyPool(self.cfg.rollout, self.tokenizer, self._rollout_factory)

    def _restore(self, state: dict[str, Any]) -> None:
        """Bring a fresh process to the state after update ``state['completed']``."""
        self._check_resumable(state)
        dropped_r = dropped_m = 0
        if self.dist.is_main:  # the other ranks never touch the run's files
            dropped_r = truncate_lines(self.run_dir / RECORDS_FILENAME, state["records"])
            dropped_m = truncate_lines(self.run_dir / "metrics.jsonl", state["metrics"])
        if dropped_r or dropped_m:
            print(f"[resume] dropped {dropped_r} record(s) and {dropped_m} metrics line(s) of an unfinished update")
        self.completed = state["completed"]
        self.records_count, self.metrics_count = state["records"], state["metrics"]
        self.checkpoints.update(state["checkpoints"])
        self.published.update(state["published"])
        self.history = QuestionHistory(self.cfg.reward.repetition_history, state["question_history"])
        self.block_questions = list(state.get("block_questions", []))
        if state.get("phase") is not None:  # stopped inside a phase: its sampled units, as saved
            saved = torch.load(self.run_dir / PHASE_FILE, weights_only=False) if self.dist.is_main else None
            if saved is not None and saved["first"] != state["phase"]:
                raise RuntimeError(f"{self.run_dir / PHASE_FILE} holds phase {saved['first']}, the state names "
                                   f"phase {state['phase']}")
            self.phase = Phase.from_state(saved) if saved is not None else Phase(state["phase"], [])
        self.prompt_counter = state["prompt_counter"]
        self.finished = state["finished"]
        self.wandb_id = state.get("wandb_id")
        self.timing.update({k: v for k, v in state.get("timing", {}).items() if k != "model_load_s"})
        for role, player in self.players.items():
            player.version = state["versions"][role]
            path = self.checkpoints.get(role)
            if path and player.trainer is not None:
                player.trainer.load_checkpoint(self.run_dir / path, restore_rng=False)
                player.trainer.offload_state()
                player.model.eval()
        restore_rng_state(state["rng"])
        if self.completed < len(self.slots):
            nxt = self.slots[self.completed]
            if not (nxt.first_of_block and nxt.role == self._first_role_of(nxt.iteration)):
                self._resume_inside_iteration(nxt.iteration, state)
        if self.method_loop is not None and state.get("method_loop") is not None:
            self.method_loop.load_state_dict(state["method_loop"])  # Socratic-Zero: curriculum, failures

    def _first_role_of(self, iteration: int) -> str:
        return next(s.role for s in self.slots if s.iteration == iteration)

    def _resume_inside_iteration(self, iteration: int, state: dict[str, Any]) -> None:
        for trainer in self._trainers():
            while trainer.outer_iteration < iteration:
                trainer.start_outer_iteration()
        if self.cfg.schedule.feedback == "stale":
            for role, player in self.players.items():
                if player.trainer is None:
                    continue
                player.published_version = state["published_versions"][role]
                player.published_model = copy.deepcopy(player.model).eval()
                src = self.published.get(role)
                if src:
                    weights = torch.load(self.run_dir / src, map_location="cpu", weights_only=True)
                    player.published_model.load_state_dict(weights)

    # ------------------------------------------------------------------ sampling models
    def _sampler(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        """(model, checkpoint name) a player samples with while ``active`` is being trained."""
        p = self.players[role]
        if role != active and self.cfg.schedule.feedback == "stale" and p.published_model is not None:
            return p.published_model, p.published_version
        return p.model, p.version

    def _engine(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        model, ver = self._sampler(role, active)
        player = self.players[role]
        key = (ver["player"], ver["outer_iteration"], ver["step"], model is player.published_model)
        own = player.trainer is not None and model is player.model
        engine = self.pool.engine(model, key, player.trainer.gathered_weights if own else contextlib.nullcontext)
        return SamplingTemperature(engine, role_temperature(self.cfg, role)), ver

    # ------------------------------------------------------------------ events
    def _trainers(self) -> list[Any]:
        """Each trainer once (a shared model's two roles have one)."""
        out: list[Any] = []
        for player in self.players.values():
            if player.trainer is not None and all(player.trainer is not t for t in out):
                out.append(player.trainer)
        return out

    def _start_iteration(self, iteration: int) -> None:
        for trainer in self._trainers():
            trainer.start_outer_iteration()  # π_ref := weights at the start of this iteration
        if self.cfg.schedule.feedback == "stale":
            pub_dir = self.run_dir / "checkpoints" / "published"
            pub_dir.mkdir(parents=True, exist_ok=True)
            for role, player in self.players.items():
                if player.trainer is None:
                    continue  # a frozen player never changes: its current weights are the published ones
                if player.published_model is None:
                    player.published_model = copy.deepcopy(player.model).eval()
                else:  # same object, new weights: its rollout engine stays valid (hf) or is re-synced (vllm)
                    with torch.no_grad():
                        player.published_model.load_state_dict(player.model.state_dict())
                player.published_version = dict(player.version)
                path = pub_dir / f"{role}.pt"
                weights = player.trainer.full_state_dict()  # a collective under ZeRO-3: on every rank
                if self.dist.is_main:
                    atomic_torch_save(weights, path)
                self.published[role] = str(path.relative_to(self.run_dir))

    def _start_block(self, slot: Slot) -> dict[str, Any]:
        active = self.players[slot.role]
        for role, player in self.players.items():
            if role != slot.role and player.model is not active.model:
                player.model.eval()
                if player.trainer is not None:
                    player.trainer.offload_state()  # frozen in this block: no optimizer state in memory
        out = self.players[slot.role].trainer.start_block()
        return {f"{slot.role}/{k}": v for k, v in out.items()}

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        """Run (or resume) to the end, or until ``schedule.max_updates`` updates or a :class:`StopRun`."""
        from unifiedplayers.sandbox import Sandbox

        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = torch.load(self.state_path, weights_only=False) if self.state_path.exists() else None
        if state is not None and not self.cfg.resume:
            raise FileExistsError(
                f"{self.run_dir} already holds a run ({state['completed']}/{state['total_updates']} updates). "
                "Pass resume=true to continue it, or choose another run_dir (or delete it) to start fresh."
            )
        if state is not None and state["finished"]:
            self._check_resumable(state)
            print(f"[resume] the run in {self.run_dir} is already complete ({state['completed']} updates)")
            self.finished, self.completed = True, state["completed"]
            return self._finish(already=True)
        main = self.dist.is_main
        if main:
            OmegaConf.save(self.cfg, self.run_dir / CONFIG_FILE, resolve=True)
        self._setup_players()
        if self.cfg.schedule.execution_pool.every > 0 and "execution" in self.trained and main:
            self.fixed_pool = FixedPool(self.cfg.schedule.execution_pool, self.run_dir)  # rank 0 evaluates it
        if state is not None:
            self._restore(state)
            print(f"[resume] continuing {self.run_dir} after update {self.completed}/{len(self.slots)}")
        if self.wandb_id is None:
            self.wandb_id = f"up-{os.urandom(4).hex()}"
        self.logger = (RunLogger(self.run_dir, self.cfg.logger, OmegaConf.to_container(self.cfg, resolve=True),
                                 run_id=self.wandb_id) if main else _NoLogger())
        show = bool(self.cfg.logger.progress) and main
        budget = self.cfg.schedule.max_updates
        done_here = 0
        writer = RecordWriter(self.run_dir / RECORDS_FILENAME) if main else contextlib.nullcontext()
        sandbox_cfg = self.cfg.sandbox
        if self.dist.enabled and sandbox_cfg.workers == 0:  # the ranks of one node share its cores
            sandbox_cfg = OmegaConf.merge(sandbox_cfg, {"workers": max(2, 2 * (os.cpu_count() or 1) // self.dist.world_size)})
        try:
            with Sandbox(sandbox_cfg) as sandbox, writer as records:
                self.sandbox = TimedSandbox(sandbox)
                self.records = records
                # arg_mutation's re-executed outputs are shown exactly as the tool loop shows observations
                self.perturber = PerturbationEngine.from_config(
                    self.cfg.perturbation, seed=self.cfg.seed, sandbox=self.sandbox,
                    observation_max_chars=self.player_cfg.observation_max_chars)
                bar = progress(total=len(self.slots), desc="updates", enabled=show, initial=self.completed, position=0)
                try:
                    while self.completed < len(self.slots):
                        if budget is not None and done_here >= budget:
                            print(f"[stop] schedule.max_updates={budget} reached; resume=true continues the run")
                            break
                        slot = self.slots[self.completed]
                        bar.set_description_str(f"it {slot.iteration} {slot.role} {slot.update + 1}/{slot.block_size}")
                        self._bar = bar
                        self._run_slot(slot)
                        done_here += 1
                        bar.update(1)
                        try:
                            for hook in self.hooks:
                                hook("update_end", self, slot)
                                if slot.last_of_block:
                                    hook("block_end", self, slot)
                        except StopRun:
                            print(f"[stop] stopped after update {self.completed}; resume=true continues the run")
                            break
                finally:
                    bar.close()
        finally:
            self.logger.close()
        if self.completed >= len(self.slots) and not self.finished:
            self.finished = True
            self._write_state()
        return self._finish() if self.finished else {"completed": self.completed, "finished": False}

    def _run_slot(self, slot: Slot) -> None:
        extra: dict[str, Any] = {}
        if slot.first_of_block:
            if slot.role == self._first_role_of(slot.iteration):
                self._start_iteration(slot.iteration)
            extra.update(self._start_block(slot))
        extra.update(self._pool_evaluation(slot, before=True))
        if self.phase is None or self.phase.first != slot.phase:  # else: resumed inside this phase
            self.phase = self._sample_phase(slot)
        metrics = self._train_step(slot)
        metrics.update(extra)
        metrics.update(self._pool_evaluation(slot))
        t = time.perf_counter()
        active = self.players[slot.role]
        if slot.last_of_block:
            metrics.update({f"{slot.role}/{k}": v for k, v in active.trainer.block_diagnostics().items()})
        self.logger.log(metrics, step=slot.index)
        self.metrics_count += 1
        self._save_active(slot)
        self.completed = slot.index + 1
        if self.completed == slot.phase + phase_steps(self.cfg):
            self.phase = None  # the phase is over: the state no longer points at it
        if slot.last_of_block:
            for q in self.block_questions:  # the block's questions join R(q)'s history for the next block
                self.history.add(q)
            self.block_questions = []
        self._write_state()
        if slot.last_of_block:
            active.trainer.offload_state()
            active.model.eval()
            self._drop_slots(slot.role)
        self.timing["checkpoint_s"] += time.perf_counter() - t

    def _pool_evaluation(self, slot: Slot, before: bool = False) -> dict[str, Any]:
        """The fixed diagnostic pool after this update (SPEC §8), when one is due; its metrics keys.

        ``before``: the initial checkpoint (update 0, Appendix D.2), evaluated before the run's first update
        (whatever its block: with method.shared_model a Planning update already moves the Execution weights).
        Rank 0 evaluates; the other ranks swap the Execution weights into their engines with it, since that
        swap can be a collective (ZeRO-3) and their engines must hold what rank 0's holds.
        """
        if "execution" not in self.trained or (slot.role != "execution" and not before):
            return {}
        if before and slot.index != 0:
            return {}
        step = 0 if before else self.execution_steps[slot.index]
        due = self.dist.broadcast(self.fixed_pool is not None and self.fixed_pool.due(step))
        if not due:
            return {}
        if not self.dist.is_main:
            self._engine("execution", "execution")
            return {}
        self._stage(f"execution pool ({len(self.fixed_pool.questions)} questions)")
        rng = capture_rng_state()  # greedy decoding; the run's RNG streams must not notice the evaluation
        engine, ver = self._engine("execution", "execution")
        entry = self.fixed_pool.evaluate(
            step, {"global_update": slot.index - (1 if before else 0), "outer_iteration": slot.iteration,
                   "checkpoint": ver},
            engine, self.sandbox, self.tokenizer, self.execution_cfg)
        restore_rng_state(rng)
        self.timing["pool_s"] += entry.get("seconds", 0.0)
        out = metrics_of(entry)
        # The initial checkpoint's figures sit on the first Execution update's line under their own names.
        return {k.replace("execution/pool_", "execution/pool0_") if before else k: v for k, v in out.items()
                if not (before and k.startswith("timing/"))}

    def _save_active(self, slot: Slot) -> None:
        """The active player's checkpoint: named at a block end, else the slot the state does not use."""
        trainer = self.players[slot.role].trainer
        base = Path("checkpoints")
        if slot.last_of_block and self.cfg.schedule.checkpoint_every_block:
            rel = base / f"iter{slot.iteration}" / slot.role
        else:
            current = self.checkpoints.get(slot.role) or ""
            rel = base / "resume" / f"{slot.role}-{'b' if current.endswith('-a') else 'a'}"
        trainer.save_checkpoint(self.run_dir / rel)  # on every rank: rank 0 writes, or every rank its shards
        for role, player in self.players.items():  # a shared model's other role points at the same weights
            if role == slot.role or (player.trainer is trainer and role in self.shared_roles):
                self.checkpoints[role] = str(rel)

    def _drop_slots(self, role: str) -> None:
        if not self.dist.is_main:
            return
        for name in ("a", "b"):
            rel = f"checkpoints/resume/{role}-{name}"
            if self.checkpoints.get(role) != rel:
                shutil.rmtree(self.run_dir / rel, ignore_errors=True)

    # ------------------------------------------------------------------ one update
    def _stage(self, name: str) -> None:
        """Show what the current update is doing (on the progress bar)."""
        bar = getattr(self, "_bar", None)
        if bar is not None:
            bar.set_postfix_str(name)

    def _tasks(self, slot: Slot, units: int) -> tuple[list[list[PlanningTask]], list[PlanningTask], list[PlanningTask]]:
        """(groups, used, unused): the Planning outputs of a phase of ``units`` updates, the well-formed tasks
        played, and the well-formed ones beyond ``units × tasks_per_update`` (recorded, not played)."""
        p = self.player_cfg
        engine, _ = self._engine("planning", slot.role)
        groups: list[list[PlanningTask]] = []
        used: list[PlanningTask] = []
        unused: list[PlanningTask] = []
        attempts = 1 if slot.role == "planning" else p.task_attempts
        prompts, wanted = units * p.prompts_per_update, units * p.tasks_per_update
        own_prompts = None
        if self.method_loop is not None:  # the method's own Planning prompts (Socratic-Zero: the Solver's failures)
            own_prompts = self.dist.broadcast(self.method_loop.planning_prompts(self.tokenizer, p, prompts)
                                              if self.dist.is_main else None)
        for attempt in range(attempts):
            got = self.dist.sample_split(
                p.tasks_per_prompt,
                lambda n, rank: generate_tasks(engine, self.tokenizer, p, self.prompt_counter, prompts,
                                               n, seed=self._seed(slot, 10 + attempt, rank), prompts=own_prompts),
                prompts)
            # Rank 0 builds the tasks (Absolute Zero's run code in the sandbox); every rank then holds the same.
            got = self.dist.broadcast([[self.build_task(t, self.sandbox) for t in g] for g in got]
                                      if self.dist.is_main else None)
            for g in got:
                for t in g:
                    t.prompt_index += len(groups)
            self.prompt_counter += prompts
            groups.extend(got)
            for t in (t for g in got for t in g if t.valid):
                if slot.role == "planning" or len(used) < wanted:
                    used.append(t)
                else:
                    unused.append(t)
            if slot.role == "planning" or len(used) >= wanted:
                break
        if self.method_loop is not None:  # the method picks the tasks played (Socratic-Zero: with its curriculum)
            groups, used, unused = self.dist.broadcast(
                self.method_loop.phase_tasks(slot.role, groups, used, unused, wanted) if self.dist.is_main else None)
        return groups, used, unused

    def _sample_phase(self, slot: Slot) -> Phase:
        """Sample one phase (its S units) with the phase-start policies, build its feedback once, write its
        records, and save it so that a run stopped inside the phase resumes on the same data."""
        cfg, p = self.cfg, self.player_cfg
        units = int(cfg.schedule.steps_per_generation)
        show = bool(cfg.logger.progress)
        t_start = time.perf_counter()
        sandbox_before = self.sandbox.seconds

        # 1. tasks (Planning block: S × prompts_per_update prompts; other blocks: S × tasks_per_update tasks)
        self._stage("planning: tasks")
        groups, tasks, unused = self._tasks(slot, units)
        _, plan_ver = self._sampler("planning", slot.role)
        questions = [task.question for task in tasks]
        # 2. K trajectories and M verifiers per task (split over the ranks, gathered on rank 0)
        self._stage(f"execution: {len(tasks)} x {p.num_trajectories} trajectories")
        exec_engine, exec_ver = self._engine("execution", slot.role)
        rollouts = self.dist.sample_split(
            p.num_trajectories,
            lambda n, rank: solve(exec_engine, self.sandbox, self.tokenizer, self.execution_cfg, questions, n,
                                  seed=self._seed(slot, 20, rank), temperature=role_temperature(cfg, "execution"),
                                  top_p=cfg.rollout.top_p),
            len(questions), to_all=False)
        eval_engine, eval_ver = self._engine("evaluation", slot.role)
        if cfg.method.verifiers:
            self._stage(f"evaluation: {len(tasks)} x {p.num_verifiers} verifiers")
            verifiers = self.dist.sample_split(
                p.num_verifiers,
                lambda n, rank: write_verifiers(eval_engine, self.tokenizer, p, questions, n,
                                                seed=self._seed(slot, 30, rank)),
                len(questions), to_all=False)
        else:  # a verdict-free method: no Evaluation samples (M = 0 below)
            verifiers = [[] for _ in questions] if self.dist.is_main else None
        sandbox_in_generation = self.sandbox.seconds - sandbox_before
        generation_s = time.perf_counter() - t_start - sandbox_in_generation
        self.block_questions.extend(questions)
        if not self.dist.is_main:  # the other ranks take part in the updates only (rank 0 broadcasts each batch)
            return Phase(slot.phase, [])
        if self.method_loop is not None:  # the method's own feedback (Socratic-Zero: the Teacher grades, refines)
            self._stage("method feedback")
            self.method_loop.after_rollouts(slot.role, tasks, rollouts)

        # 3. perturbations, 4. verdict matrices
        self._stage("sandbox: perturbations and verdicts")
        flat = [r.trajectory for task_rollouts in rollouts for r in task_rollouts]
        if cfg.method.verifiers:
            variants_flat = self.perturber.perturb_many(flat)
        else:  # nothing would check the variants
            variants_flat = [[None] * len(self.perturber.rules) for _ in flat]
        k = p.num_trajectories
        verdicts = []
        for i in progress(range(len(tasks)), desc="sandbox: verdicts", enabled=show, position=1):
            verdicts.append(verdict_matrix([v.source for v in verifiers[i]], flat[i * k:(i + 1) * k],
                                           variants_flat[i * k:(i + 1) * k], self.sandbox))

        # 5. rewards (R(q) against the question history as it stood at the start of the block)
        history = list(self.history)
        feedback, role_rewards = [], {"planning": [], "execution": [], "evaluation": []}
        for i, task in enumerate(tasks):
            vm = verdicts[i]
            answers = [r.final_answer for r in rollouts[i]]
            tr = task_rewards(vm.z_orig, vm.z_adv, vm.valid, vm.num_generated, vm.valid_sources, answers,
                              task.question, history, cfg.reward, adv_mask=vm.adv_mask, adv_errors=vm.error_adv)
            fb = TaskFeedback(tr, answers, cfg.reward, tool_calls=[r.num_tool_calls for r in rollouts[i]],
                              expected_answer=task.expected_answer, question=task.question, method_cfg=cfg.method,
                              answer_check=task.check)
            feedback.append(fb)
            role_rewards["execution"].append(np.asarray(self.reward_sources["execution"](fb), dtype=np.float64))
            role_rewards["evaluation"].append(np.asarray(self.reward_sources["evaluation"](fb), dtype=np.float64))
        # Planning rewards per task, or over the whole phase's batch (R-Zero's and Agent0's within-batch
        # repetition penalty clusters the questions sampled together).
        role_rewards["planning"] = planning_rewards(cfg.method, feedback)
        sandbox_s = self.sandbox.seconds - sandbox_before

        # 6. the S units: disjoint mini-batches of the active player's groups, advantages within each group
        malformed = float(cfg.reward.malformed_task_reward)
        task_index = {id(t): i for i, t in enumerate(tasks)}
        if slot.role == "planning":  # a unit is a share of the questioner prompts, with their tasks
            group_units = split_units(len(groups), units)
            task_units = [[task_index[id(t)] for g in idx for t in groups[g] if id(t) in task_index]
                          for idx in group_units]
        else:
            task_units = split_units(len(tasks), units)
            group_units = [list(range(len(groups)))] * units  # the Planning outputs: phase-wide figures
        unit_of_task = {i: u for u, idx in enumerate(task_units) for i in idx}
        phase_units: list[Unit] = []
        for u, (g_idx, t_idx) in enumerate(zip(group_units, task_units)):
            sub = lambda xs: [xs[i] for i in t_idx]  # noqa: E731
            u_groups = [groups[g] for g in g_idx]
            u_rewards = {r: sub(v) for r, v in role_rewards.items()}
            makers, rewards, gids = group_samples(slot.role, u_groups, sub(tasks), sub(rollouts), sub(verifiers),
                                                  u_rewards, malformed)
            trainer_cfg = role_trainer_config(cfg.trainer, slot.role)
            shapes = None
            if slot.role != "planning":  # group g of the unit is its task g (a baseline may shape it)
                shapes = {g: group_shape(cfg.method, slot.role, fb, clip_eps=trainer_cfg.clip_eps)
                          for g, fb in enumerate(sub(feedback))}
            # A method's own batch (Socratic-Zero: the Solver's DPO pairs, the Generator's imitation) replaces GRPO's.
            own = (self.method_loop.unit_batch(slot.role, t_idx, self.tokenizer, p)
                   if self.method_loop is not None else None)
            batch = own if own is not None else training_batch(
                makers, rewards, gids, trainer_cfg, cfg.schedule.drop_zero_advantage_groups, shapes)
            m = unit_metrics(u_groups, sub(tasks), sub(rollouts), sub(verdicts), sub(feedback), u_rewards,
                             slot.role, malformed)
            if self.method_loop is not None:
                m.update(self.method_loop.unit_metrics(slot.role, t_idx))
            if shapes is not None:
                m[f"{slot.role}/kept_groups"] = (sum(sh.keep for sh in shapes.values()) / len(shapes)) if shapes else None
            phase_units.append(Unit(batch, m))

        # 7. the phase's records (one per Planning output), written once; then the phase is saved
        ckpts = {"planning": plan_ver, "execution": exec_ver, "evaluation": eval_ver}

        unit_of_group = {g: u for u, idx in enumerate(group_units) for g in idx}

        def meta_of_task(i: Optional[int], g: int) -> dict[str, Any]:
            # Planning: a prompt's outputs, malformed ones included, train in its unit; else the task's unit
            # (a Planning output not played in another block: the phase's first update).
            u = unit_of_group[g] if slot.role == "planning" else (unit_of_task.get(i, 0) if i is not None else 0)
            meta = {"outer_iteration": slot.iteration, "block": slot.role, "phase": slot.phase,
                    "update": slot.update + u, "global_update": slot.phase + u, "checkpoints": ckpts}
            if i is not None and self.method_loop is not None:  # e.g. the Teacher's grades, the failure
                meta.update(self.method_loop.record_meta(i))
            return meta

        records = phase_records(groups, tasks, unused, rollouts, verifiers, verdicts, variants_flat, feedback,
                                role_rewards, self.perturber.rules, meta_of_task, malformed)
        for rec in records:
            self.records.append(rec)
        self.records_count += len(records)
        phase = Phase(slot.phase, phase_units,
                      {"generation_s": generation_s, "sandbox_s": sandbox_s,
                       "feedback_s": time.perf_counter() - t_start - generation_s - sandbox_s,
                       "total_s": time.perf_counter() - t_start})
        self.timing["generation_s"] += generation_s
        self.timing["sandbox_s"] += sandbox_s
        self.phase = phase
        if phase_steps(cfg) > 1:  # a stop inside the phase resumes on these units, not on a new sample
            atomic_torch_save(phase.to_state(), self.run_dir / PHASE_FILE)
            self._write_state()
        return phase

    def _seed(self, slot: Slot, stage: int, rank: int) -> int:
        """The seed of one rank's share of one generation stage of a phase (rank 0: the single-process seed)."""
        return seed_for(self.cfg.seed, slot.phase, stage + 1000 * rank)

    def _train_step(self, slot: Slot) -> dict[str, Any]:
        """One optimizer step of the active player on its unit of the phase; the step's metrics line."""
        t = time.perf_counter()
        n_pass, u = unit_of_step(slot.step_in_phase, int(self.cfg.schedule.steps_per_generation))
        unit = self.phase.units[u] if self.dist.is_main else None
        self._stage(f"GRPO update of {slot.role} (phase step {slot.step_in_phase + 1}/{phase_steps(self.cfg)})")
        batch = self.dist.broadcast(unit.batch if unit is not None else None)
        trainer_metrics: dict[str, float] = {}
        active = self.players[slot.role]
        if batch:
            active.model.train()
            trainer_metrics = active.trainer.update(batch)
            active.model.eval()
            for player in self.players.values():  # both roles of a shared model name the new weights
                if player.model is active.model:
                    player.version = version(slot.role, slot.iteration, active.trainer.global_step)
        update_s = time.perf_counter() - t
        self.timing["update_s"] += update_s
        if unit is None:
            return {}
        # A unit's sampling and feedback figures go on its first pass's line only (each sample counted once).
        metrics: dict[str, Any] = dict(unit.metrics) if n_pass == 0 else {}
        metrics[f"{slot.role}/skipped"] = float(not trainer_metrics)
        metrics.update(trainer_metrics_line(slot.role, trainer_metrics, active.trainer.global_step))
        sampled_here = slot.first_of_phase  # the phase's sampling and feedback are timed on its first step
        metrics.update({
            "outer_iteration": slot.iteration, "block": slot.role, "update": slot.update, "global_update": slot.index,
            "phase": slot.phase, "phase_step": slot.step_in_phase, "phase_pass": n_pass, "phase_unit": u,
            "timing/generation_s": self.phase.timing["generation_s"] if sampled_here else 0.0,
            "timing/sandbox_s": self.phase.timing["sandbox_s"] if sampled_here else 0.0,
            "timing/update_s": update_s,
            "timing/total_s": update_s + (self.phase.timing["total_s"] if sampled_here else 0.0),
        })
        self._stage("records, checkpoint")
        return metrics

    # ------------------------------------------------------------------ the end
    def _prune_checkpoints(self) -> None:
        """Apply ``schedule.checkpoint_retention`` to a finished run's checkpoints (idempotent)."""
        keep = self.cfg.schedule.checkpoint_retention
        root = self.run_dir / "checkpoints"
        if keep == "all" or not self.finished or not root.is_dir():
            return
        for group in sorted(p for p in root.iterdir() if p.is_dir()):
            if group.name == "published":  # stale feedback's snapshots: used while the run goes on only
                shutil.rmtree(group, ignore_errors=True)
                continue
            for ckpt in sorted(p for p in group.iterdir() if p.is_dir()):
                role = ckpt.name.split("-")[0]  # iter<N>/<role> or resume/<role>-a|b
                if keep == "execution_weights" and role != "execution":
                    shutil.rmtree(ckpt, ignore_errors=True)
                    continue
                for name in ("optimizer.pt", "reference.pt"):
                    (ckpt / name).unlink(missing_ok=True)
                if (ckpt / "model.pt").is_file():  # a DeepSpeed checkpoint's resume state (its optimizer
                    shutil.rmtree(ckpt / "deepspeed", ignore_errors=True)  # partitions); model.pt stays

    def _finish(self, already: bool = False) -> dict[str, Any]:
        from unifiedplayers.summary import write_summary

        if not self.dist.is_main:
            return {"completed": self.completed, "finished": self.finished, "rank": self.dist.rank}
        summary, text = write_summary(self.run_dir, timing=self.timing if not already else None)
        self._prune_checkpoints()
        if self.cfg.schedule.print_summary:
            print(text)
        return summary
