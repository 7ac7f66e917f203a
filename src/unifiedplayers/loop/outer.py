"""The outer loop of UnifiedPlayers (§3.3, Appendix B.4): Planning → Execution → Evaluation blocks of
``schedule.<role>_updates`` GRPO updates of one player each (``schedule``), cut into sampling phases of S × μ
updates. Each update runs these stages in order:

1. at a block's start: π_ref reset and stale copies published (a new iteration), the others frozen (``team``);
2. at a phase's start, with the policies as they stand: **sample** tasks, K trajectories and M verifiers
   (``sampling``: one ``PlayedTask`` record per played task, which each later stage adds to); **feedback**:
   perturb, verdict matrices, rewards (``phase.add_feedback``: ``feedback.phase_feedback``, then the method's
   reward sources); **GRPO minibatches** with advantages (Eq. 17; ``phase.build_minibatches``); the phase's records;
3. **train**: one optimizer step on the active player's minibatch, against the behaviour log-probs (Eq. 18-19);
4. the metrics line; on the save cadence (``schedule.save_due``) the **checkpoint**, then the **run state**
   naming it: a killed run replays the updates after its last save exactly. R(q)'s question history is fixed
   within a block; the block's questions join it at its end.

Side effects are callbacks (``callbacks``). Over several ranks rank 0 runs this loop and the others follow its calls
(``loop.ranks``).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from omegaconf import OmegaConf

from unifiedplayers.loop import ranks
from unifiedplayers.loop.ranks import Follower, Leader
from unifiedplayers.loop.run_files import DiagnosticPool, RunFiles, finish
from unifiedplayers.loop.checkpoints import save_active, thin_at_block_end
from unifiedplayers.checks import validate
from unifiedplayers.config import resolve_player_config
from unifiedplayers.distributed import SINGLE, DistContext, sandbox_config
from unifiedplayers.loop.engines import TimedSandbox
from unifiedplayers.export import export_at_end
from unifiedplayers.machine import earlier_starts, record_start
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.precision import resolve_run_precision
from unifiedplayers.feedback.pipeline import FeedbackContext
from unifiedplayers.diagnostics.logging import verdict_progress
from unifiedplayers.loop.phase import Phase, PhaseContext, add_feedback, build_minibatches, phase_records, \
    train_step
from unifiedplayers.feedback.rewards import QuestionHistory
from unifiedplayers.roles import ROLES
from unifiedplayers import rundir
from unifiedplayers.loop.run_state import RunState, atomic_torch_save, restore, saved_state, \
    write_state
from unifiedplayers.loop.sampling import PhaseSampler
from unifiedplayers.schedule import Slot, execution_config, phase_steps, plan_updates, save_due, trained_roles
from unifiedplayers.loop.team import Team

class StopRun(Exception):
    """Raised by a hook to end the process cleanly after a completed update (the run stays resumable)."""


class OuterLoop:
    """Runs (or resumes) one run in ``run_dir``. ``hooks``: ``hook(event, loop, slot)`` at ``"update_end"`` and
    ``"block_end"`` (raise :class:`StopRun` to stop); ``backbone``: a loaded ``(model, tokenizer)``;
    ``rollout_factory``: ``(rollout_cfg, model, tokenizer) -> engine`` (tests); ``dist``: this process's rank."""

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, hooks: Sequence[Callable[..., None]] = (),
                 backbone: Optional[tuple[Any, Any]] = None, rollout_factory: Optional[Callable[..., Any]] = None,
                 dist: DistContext = SINGLE) -> None:
        self.method = validate(cfg, dist)
        self.cfg, self.run_dir, self.hooks, self.dist, self._backbone = cfg, Path(run_dir), list(hooks), dist, backbone
        self.slots, self.trained = plan_updates(cfg), trained_roles(cfg)
        self.player_cfg = resolve_player_config(cfg)  # with trainer.roles' group sizes and token budgets
        self.execution_cfg = execution_config(self.player_cfg, self.method.use_tools)
        # rank 0's team: what every rank must run is sent to the others first (loop.ranks)
        self.team = Leader(dist, Team(cfg, self.player_cfg, self.trained, self.method.shared_model, dist,
                                      rollout_factory))
        self.state = RunState(checkpoints=dict.fromkeys(ROLES), published=dict.fromkeys(ROLES))
        self.history = QuestionHistory(cfg.reward.repetition_history)  # R(q)'s, fixed within a block
        self.phase: Optional[Phase] = None  # the sampling phase in progress
        self.saved = 0  # updates completed at the last save

    players = property(lambda self: self.team.players)
    finished = property(lambda self: self.state.finished)

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        """Run (or resume) to the end, or until ``schedule.max_updates`` updates or a :class:`StopRun`. Over several
        ranks rank 0 runs it and the others follow (:mod:`unifiedplayers.loop.ranks`)."""
        return ranks.run(self.dist, self._lead, self._follow)

    def _lead(self) -> dict[str, Any]:
        from unifiedplayers.sandbox import Sandbox

        self.run_dir.mkdir(parents=True, exist_ok=True)  # a run there is resumed with resume=true, never overwritten
        saved = saved_state(self.run_dir, self.cfg, self.dist.world_size)
        if saved is not None and saved["finished"]:
            print(f"[resume] the run in {self.run_dir} is already complete ({saved['completed']} updates)")
            self.state.finished, self.state.completed = True, saved["completed"]
            self.team.stop(self.state.completed, True)
            return finish(self.cfg, self.run_dir, True, None)
        resolve_run_precision(self.cfg, saved["config"] if saved else None)  # auto: once; a resume keeps it
        self.cfg.machine = earlier_starts(self.run_dir / rundir.CONFIG) if saved is not None else []  # a resume: kept
        OmegaConf.save(self.cfg, self.run_dir / rundir.CONFIG, resolve=True)
        self.team.start(saved["config"] if saved else None, saved["completed"] if saved else 0)
        self.team.setup(*self.team.load_backbone(self._backbone, self.state.timing))
        self.diagnostic_pool = DiagnosticPool(self.cfg, self.run_dir, self.trained, self.slots)
        if saved is not None:
            self.state, self.phase = restore(saved, self.cfg, self.run_dir, self.team, self.method, self.slots,
                                             self.state)
            self.history = QuestionHistory(self.cfg.reward.repetition_history, self.state.question_history)
            self.saved = self.state.completed
        self.state.wandb_id = self.state.wandb_id or f"up-{os.urandom(4).hex()}"
        with Sandbox(sandbox_config(self.cfg.sandbox, self.dist)) as sandbox, RunFiles(  # closed whatever happens
                self.cfg, self.run_dir, len(self.slots), self.state.completed, self.state.wandb_id) as files:
            record_start(self.cfg, self.state.completed, sandbox, self.run_dir / rundir.CONFIG)  # its sandbox's layers
            self.files, self.sandbox = files, TimedSandbox(sandbox)
            self.sampler = PhaseSampler(self.cfg, self.player_cfg, self.execution_cfg, self.method, self.team,
                                        self.sandbox, files.progress, self.state.prompt_counter)
            self.perturber = PerturbationEngine.from_config(  # arg_mutation shows outputs as the tool loop does
                self.cfg.perturbation, seed=self.cfg.seed, sandbox=self.sandbox,
                observation_max_chars=self.player_cfg.observation_max_chars)
            self._updates()
        if self.state.completed >= len(self.slots) and not self.state.finished:
            self.state.finished = True
            self._write_state()
            if self.cfg.schedule.export_at_end:  # before finish(): retention may drop weights
                export_at_end(self.run_dir)
        self.team.stop(self.state.completed, self.state.finished)
        if not self.state.finished:
            return {"completed": self.state.completed, "finished": False}
        return finish(self.cfg, self.run_dir, True, self.state.timing)

    def _follow(self, start: dict[str, Any]) -> dict[str, Any]:
        """A rank but 0: set up as rank 0 did (its dtypes, the players, a sandbox), then run its calls."""
        from unifiedplayers.sandbox import Sandbox

        resolve_run_precision(self.cfg, start["stored_config"])
        self.team.setup(*self.team.load_backbone(self._backbone, self.state.timing))
        with Sandbox(sandbox_config(self.cfg.sandbox, self.dist)) as sandbox:
            record_start(self.cfg, start["completed"], sandbox)  # a missing isolation layer is warned about here too
            return Follower(self.dist, self.team.team, sandbox).follow()

    def _updates(self) -> None:
        budget, done_here = self.cfg.schedule.max_updates, 0
        while self.state.completed < len(self.slots):
            if budget is not None and done_here >= budget:
                print(f"[stop] schedule.max_updates={budget} reached; resume=true continues the run")
                break
            slot = self.slots[self.state.completed]
            self.files.start_update(slot)
            self._update(slot)
            done_here += 1
            self.files.end_update()
            try:
                for hook in self.hooks:
                    hook("update_end", self, slot)
                    if slot.last_of_block:
                        hook("block_end", self, slot)
            except StopRun:
                print(f"[stop] stopped after update {self.state.completed}; resume=true continues the run")
                break
        if self.saved < self.state.completed:  # a clean stop between two saves keeps its updates
            self._save(self.slots[self.state.completed - 1])

    def _update(self, slot: Slot) -> None:
        """One update: the stages in order (the module docstring)."""
        extra: dict[str, Any] = {}
        if slot.first_of_block:
            if slot.role == next(s.role for s in self.slots if s.iteration == slot.iteration):
                self.team.start_iteration(self.run_dir, self.state.published)
            extra.update(self.team.start_block(slot.role))
        extra.update(self.diagnostic_pool.metrics(slot, self.team, self.sandbox, self.execution_cfg,
                                                  self.state.timing, self.files.progress, before=True))
        if self.phase is None or self.phase.first != slot.phase_first:  # else: resumed inside this phase
            self.phase = self._sample_phase(slot)
        metrics, update_s = train_step(slot, self.phase, self.team, int(self.cfg.schedule.steps_per_generation),
                                       phase_steps(self.cfg), self.files.progress)
        self.state.timing["update_s"] += update_s
        metrics.update(extra)
        metrics.update(self.diagnostic_pool.metrics(slot, self.team, self.sandbox, self.execution_cfg,
                                                    self.state.timing, self.files.progress))
        t = time.perf_counter()
        if slot.last_of_block:
            metrics.update(self.team.block_diagnostics(slot.role))
        self.files.metrics(metrics, slot.index)
        self.state.metrics += 1
        self.state.completed = slot.index + 1
        if self.state.completed == slot.phase_first + phase_steps(self.cfg):
            self.phase = None  # the phase is over: a state saved now no longer points at it
        if slot.last_of_block:  # the block's questions join R(q)'s history for the next block
            self.history.extend(self.state.block_questions)
            self.state.block_questions = []
        if save_due(slot, self.cfg.schedule.save_every, phase_steps(self.cfg), self.state.phase):
            self._save(slot)
        if slot.last_of_block:
            self.team.end_block(slot.role, {s.role for s in self.slots[slot.index + 1:]})
            thin_at_block_end(self.run_dir, slot.role, self.state.checkpoints, self.cfg.schedule.checkpoint_retention)
        self.state.timing["checkpoint_s"] += time.perf_counter() - t

    def _sample_phase(self, slot: Slot) -> Phase:
        """Sample one phase, build its feedback and minibatches once, write its records, and save it. Timed by stage
        (:class:`~unifiedplayers.diagnostics.timing.StageClock`): generation, sandbox, and ``feedback``, the rest."""
        clock = self.sandbox.clock
        before = dict(clock.seconds)
        with clock("feedback"):
            phase = self._build_phase(slot)
        spent = clock.since(before)
        phase.timing = {f"{name}_s": spent.get(name, 0.0) for name in ("generation", "sandbox", "feedback")}
        phase.timing["total_s"] = sum(phase.timing.values())
        self.state.timing["generation_s"] += phase.timing["generation_s"]
        self.state.timing["sandbox_s"] += phase.timing["sandbox_s"]
        if phase_steps(self.cfg) > 1:  # a clean stop inside the phase resumes on these minibatches, not on a new sample
            atomic_torch_save(phase.to_state(), self.run_dir / rundir.PHASE)
        return phase

    def _build_phase(self, slot: Slot) -> Phase:
        sample = self.sampler.sample(slot, int(self.cfg.schedule.steps_per_generation))
        self.state.prompt_counter = self.sampler.prompt_counter
        self.state.block_questions.extend(sample.questions)
        played = sample.played  # one record per played task, added to by each stage below
        self.files.progress("method feedback")  # the method's own (Socratic-Zero: the Teacher grades, refines)
        method_metrics = self.method.after_rollouts(slot.role, played) or {}
        self.files.progress("sandbox: perturbations and verdicts")
        add_feedback(played, self.method, FeedbackContext(  # R(q) against the history at the block's start
            self.perturber, self.sandbox, self.cfg.reward, list(self.history),
            verifiers=self.method.writes_verifiers, method_cfg=self.method.method_cfg,
            settings=self.method.settings, progress=verdict_progress if self.cfg.logger.progress else None))
        ctx = PhaseContext(slot, sample.groups, sample.unused, sample.versions, self.cfg, self.method,
                           self.team.tokenizer, self.player_cfg, self.perturber.rules, method_metrics)
        phase_minibatches = build_minibatches(played, ctx)
        if self.cfg.trainer.recompute_old_logprobs:  # π_old := the trainer's own forward (on every rank)
            self.team.recompute_old_logprobs(slot.role, [u.batch for u in phase_minibatches])
        records = phase_records(played, ctx)
        self.files.records(records)
        self.state.records += len(records)
        self.phase = Phase(slot.phase_first, phase_minibatches)
        return self.phase

    def _save(self, slot: Slot) -> None:
        """The active player's checkpoint after update ``slot``, then the run state that names it."""
        save_active(self.team, slot, self.run_dir, self.state.checkpoints, self.cfg.schedule.checkpoint_every_block)
        self.saved = slot.index + 1
        self._write_state()

    def _write_state(self) -> None:
        self.state.phase = self.phase.first if self.phase is not None else None
        self.state.question_history = list(self.history)
        write_state(self.state, self.run_dir / rundir.STATE, self.team, self.method, len(self.slots),
                    self.dist.world_size, self.cfg)
