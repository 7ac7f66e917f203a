"""The outer loop of UnifiedPlayers (§3.3, Appendix B.4), in one function (:meth:`OuterLoop._loop`):

    for iteration:                       π_ref reset, stale copies published (``team.start_iteration``)
        for block (one player's role):   the others frozen (``team.start_block``); R(q)'s history takes the
                                         last block's questions, then stays fixed
            for phase (S × μ updates):   sample tasks, K trajectories, M verifiers (``sampling``), once, with the
                                         policies as they stand; feedback: perturb, verdict matrices, rewards
                                         (``phase.add_feedback``); GRPO minibatches with advantages (Eq. 17,
                                         ``phase.build_minibatches``); the phase's records
                for step:                one optimizer step of the active player on its minibatch, against the
                                         behaviour log-probs (Eq. 18-19, ``phase.train_step``); the metrics line;
                                         at a phase's end, when due (``schedule.save_due``), the checkpoint and
                                         then the run state that names it
            (the block's end)            its player idle, checkpoints no longer named thinned

A killed run resumes at the position of its last save (``schedule.position``) and replays the updates after it
exactly. Side effects are callbacks (``run_files``). Over several ranks rank 0 runs this loop and the others run
the team calls it sends them (``loop.ranks``).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from omegaconf import OmegaConf

from unifiedplayers import rundir
from unifiedplayers.checks import validate
from unifiedplayers.config import resolve_player_config
from unifiedplayers.diagnostics.logging import verdict_progress
from unifiedplayers.distributed import SINGLE, DistContext, sandbox_config
from unifiedplayers.export import export_at_end
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.feedback.pipeline import FeedbackContext
from unifiedplayers.feedback.rewards import QuestionHistory
from unifiedplayers.loop import ranks
from unifiedplayers.loop.checkpoints import save_active, thin_at_block_end
from unifiedplayers.loop.engines import TimedSandbox
from unifiedplayers.loop.phase import Phase, PhaseContext, add_feedback, build_minibatches, phase_records, train_step
from unifiedplayers.loop.run_files import DiagnosticPool, RunFiles, finish
from unifiedplayers.loop.run_state import RunState, atomic_torch_save, restore, saved_state, write_state
from unifiedplayers.loop.sampling import PhaseSampler
from unifiedplayers.loop.team import Team
from unifiedplayers.machine import earlier_starts, record_start
from unifiedplayers.precision import resolve_run_precision
from unifiedplayers.roles import ROLES
from unifiedplayers.schedule import (Update, blocks, execution_config, phase_steps, position, save_due,
                                     total_updates, trained_roles)


class StopRun(Exception):
    """Raised by a hook to end the process cleanly after a completed update (the run stays resumable)."""


class OuterLoop:
    """Runs (or resumes) one run in ``run_dir``. ``hooks``: ``hook(event, loop, update)`` at ``"update_end"`` and
    ``"block_end"`` (raise :class:`StopRun` to stop; ``update``: a :class:`~unifiedplayers.schedule.Update`);
    ``backbone``: a loaded ``(model, tokenizer)``; ``rollout_factory``: ``(rollout_cfg, model, tokenizer) -> engine``
    (tests); ``dist``: this process's rank."""

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, hooks: Sequence[Callable[..., None]] = (),
                 backbone: Optional[tuple[Any, Any]] = None, rollout_factory: Optional[Callable[..., Any]] = None,
                 dist: DistContext = SINGLE) -> None:
        self.method = validate(cfg, dist)
        self.cfg, self.run_dir, self.hooks, self.dist, self._backbone = cfg, Path(run_dir), list(hooks), dist, backbone
        self.blocks, self.trained = blocks(cfg), trained_roles(cfg)
        self.total, self.per_phase = total_updates(cfg), phase_steps(cfg)
        self.player_cfg = resolve_player_config(cfg)  # with trainer.roles' group sizes and token budgets
        self.execution_cfg = execution_config(self.player_cfg, self.method.use_tools)
        self.team = Team(cfg, self.player_cfg, self.trained, self.method.shared_model, dist, rollout_factory)
        self.state = RunState(checkpoints=dict.fromkeys(ROLES), published=dict.fromkeys(ROLES))
        self.history = QuestionHistory(cfg.reward.repetition_history)  # R(q)'s, fixed within a block
        self.phase: Optional[Phase] = None  # the sampling phase in progress
        self.saved = 0  # updates completed at the last save
        self.published_versions: dict[str, Any] = {}  # a resumed run's stale copies' checkpoint names

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
            ranks.stop(self.dist, self.state.completed, True)
            return finish(self.cfg, self.run_dir, True, None)
        resolve_run_precision(self.cfg, saved["config"] if saved else None)  # auto: once; a resume keeps it
        self.cfg.machine = earlier_starts(self.run_dir / rundir.CONFIG) if saved is not None else []  # a resume: kept
        OmegaConf.save(self.cfg, self.run_dir / rundir.CONFIG, resolve=True)
        ranks.start(self.dist, saved["config"] if saved else None, saved["completed"] if saved else 0)
        self.team.setup(*self.team.load_backbone(self._backbone, self.state.timing))
        self.pool = DiagnosticPool(self.cfg, self.run_dir, self.trained)
        if saved is not None:
            self.state, self.phase = restore(saved, self.run_dir, self.team, self.method, self.state)
            self.history = QuestionHistory(self.cfg.reward.repetition_history, self.state.question_history)
            self.saved, self.published_versions = self.state.completed, saved["published_versions"]
        self.state.wandb_id = self.state.wandb_id or f"up-{os.urandom(4).hex()}"
        budget = self.cfg.schedule.max_updates  # a clean stop after that many updates, unless the run ends first
        self.stop_at = None if budget is None or self.state.completed + budget >= self.total else \
            self.state.completed + budget
        with Sandbox(sandbox_config(self.cfg.sandbox, self.dist)) as sandbox, RunFiles(  # closed whatever happens
                self.cfg, self.run_dir, self.total, self.state.completed, self.state.wandb_id) as files:
            record_start(self.cfg, self.state.completed, sandbox, self.run_dir / rundir.CONFIG)  # its sandbox's layers
            self.files, self.team.sandbox = files, TimedSandbox(sandbox)
            self.sampler = PhaseSampler(self.cfg, self.player_cfg, self.execution_cfg, self.method, self.team,
                                        files.progress, self.state.prompt_counter)
            self.perturber = PerturbationEngine.from_config(  # arg_mutation shows outputs as the tool loop does
                self.cfg.perturbation, seed=self.cfg.seed, sandbox=self.team.sandbox,
                observation_max_chars=self.player_cfg.observation_max_chars)
            self._loop()
        if self.state.completed >= self.total and not self.state.finished:
            self.state.finished = True
            self._write_state()
            if self.cfg.schedule.export_at_end:  # before finish(): retention may drop weights
                export_at_end(self.run_dir)
        ranks.stop(self.dist, self.state.completed, self.state.finished)
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
            self.team.sandbox = sandbox
            return ranks.follow(self.dist, self.team)

    def _loop(self) -> None:
        """The run from where it stands (a new run from the start, a resumed one from the position its last save
        names): for iteration, for block, for phase, for step (§3.3, Appendix B.4)."""
        per_phase, index = self.per_phase, self.state.completed
        if index == self.stop_at:  # schedule.max_updates=0
            return self._stop(None)
        first, b0, p0, s0 = position(self.cfg, index)
        for iteration in range(first, self.cfg.schedule.outer_iterations + 1):
            # ---- an outer iteration's start: π_ref := the current weights; stale feedback publishes the players
            if (b0, p0, s0) == (0, 0, 0):
                for role in self.team.start_iteration():
                    self._publish(role, self.team.full_weights(role))
            else:  # resumed inside it: its π_ref and published copies, as they were
                self.team.resume_iteration(iteration, self.run_dir, self.published_versions, self.state.published)
            for b in range(b0, len(self.blocks)):
                role, size = self.blocks[b]
                # ---- a block's start: the other players frozen; R(q)'s history takes the last block's questions
                opening: dict[str, Any] = {}  # figures for the block's first line
                if (p0, s0) == (0, 0):
                    opening = self.team.start_block(role)
                    self.history.extend(self.state.block_questions)
                    self.state.block_questions = []
                    if index == 0:  # the initial checkpoint's pool accuracy (update 0, Appendix D.2)
                        opening.update(self.pool.metrics(Update(iteration, role, 0, 0, 0), self.team,
                                                         self.execution_cfg, self.state.timing, self.files.progress,
                                                         before=True))
                for phase in range(p0, size // per_phase):
                    # ---- a phase's start: sample with the policies as they stand, feedback, minibatches, records
                    if s0 == 0:  # (else resumed inside it: its minibatches as saved)
                        self.phase = self._sample_phase(Update(iteration, role, phase * per_phase, 0, index))
                    for step in range(s0, per_phase):
                        # ---- one update: train the active player on its minibatch, log, save when due
                        at = Update(iteration, role, phase * per_phase + step, step, index)
                        self.files.start_update(at, size)
                        self._update(at, size, opening)
                        opening, index = {}, index + 1
                        if step == per_phase - 1:  # the phase's end: a state saved from now on no longer names it
                            self.phase = None
                            if (save_due(at.step_in_block + 1, size, per_phase, self.cfg.schedule.save_every)
                                    or self.state.phase == at.phase_first):  # the phase a clean stop saved: its end
                                self._save(at, block_end=at.step_in_block == size - 1)
                        self.files.end_update()
                        stop = self._stops("update_end", at)  # a hook's StopRun, or max_updates: a clean stop
                        if (stop or index == self.stop_at) and at.step_in_block < size - 1:  # (a block's last: at its end)
                            return self._stop(at)
                    s0 = 0
                p0 = 0
                # ---- a block's end: its player idle, the checkpoints the state no longer names thinned
                later = self.blocks[b + 1:] if iteration == self.cfg.schedule.outer_iterations else self.blocks
                self.team.end_block(role, {r for r, _ in later})
                thin_at_block_end(self.run_dir, role, self.state.checkpoints, self.cfg.schedule.checkpoint_retention)
                if stop or self._stops("block_end", at) or index == self.stop_at:
                    return self._stop(at)
            b0 = 0

    def _update(self, at: Update, block_size: int, opening: dict[str, Any]) -> None:
        """One optimizer step and its metrics line: the step's figures, ``opening`` (the block's start), the pool's
        accuracy when due, the trainer's figures over the block on its last line."""
        metrics, update_s = train_step(at, self.phase, self.team, int(self.cfg.schedule.steps_per_generation),
                                       self.per_phase, self.files.progress)
        self.state.timing["update_s"] += update_s
        metrics.update(opening)
        metrics.update(self.pool.metrics(at, self.team, self.execution_cfg, self.state.timing, self.files.progress))
        if at.step_in_block == block_size - 1:
            metrics.update(self.team.block_diagnostics(at.role))
        self.files.metrics(metrics, at.index)
        self.state.metrics += 1
        self.state.completed = at.index + 1

    def _stops(self, event: str, at: Update) -> bool:
        """Run the hooks of ``event``; whether one of them stopped the run (:class:`StopRun`)."""
        try:
            for hook in self.hooks:
                hook(event, self, at)
        except StopRun:
            return True
        return False

    def _stop(self, at: Optional[Update]) -> None:
        """A clean stop after update ``at``: its updates kept (saved unless the last save holds them)."""
        why = (f"schedule.max_updates={self.cfg.schedule.max_updates} reached" if self.state.completed == self.stop_at
               else f"stopped after update {self.state.completed}")
        print(f"[stop] {why}; resume=true continues the run")
        if at is not None and self.saved < self.state.completed:
            self._save(at, block_end=False)  # a block's last update is saved already

    def _sample_phase(self, at: Update) -> Phase:
        """Sample the phase that update ``at`` starts, build its feedback and minibatches once, write its records, and
        save it, timed by stage: generation, sandbox, and ``feedback`` (the rest)."""
        clock = self.team.sandbox.clock
        before = dict(clock.seconds)
        with clock("feedback"):
            phase = self._build_phase(at)
        spent = clock.since(before)
        phase.timing = {f"{name}_s": spent.get(name, 0.0) for name in ("generation", "sandbox", "feedback")}
        phase.timing["total_s"] = sum(phase.timing.values())
        self.state.timing["generation_s"] += phase.timing["generation_s"]
        self.state.timing["sandbox_s"] += phase.timing["sandbox_s"]
        if self.per_phase > 1:  # a clean stop inside the phase resumes on these minibatches, not on a new sample
            atomic_torch_save(phase.to_state(), self.run_dir / rundir.PHASE)
        return phase

    def _build_phase(self, at: Update) -> Phase:
        sample = self.sampler.sample(at, int(self.cfg.schedule.steps_per_generation))
        self.state.prompt_counter = self.sampler.prompt_counter
        self.state.block_questions.extend(sample.questions)
        played = sample.played  # one record per played task, added to by each stage below
        self.files.progress("method feedback")  # the method's own (Socratic-Zero: the Teacher grades, refines)
        method_metrics = self.method.after_rollouts(at.role, played) or {}
        self.files.progress("sandbox: perturbations and verdicts")
        add_feedback(played, self.method, FeedbackContext(  # R(q) against the history at the block's start
            self.perturber, self.team.sandbox, self.cfg.reward, list(self.history),
            verifiers=self.method.writes_verifiers, method_cfg=self.method.method_cfg,
            settings=self.method.settings, progress=verdict_progress if self.cfg.logger.progress else None))
        ctx = PhaseContext(at, sample.groups, sample.unused, sample.versions, self.cfg, self.method,
                           self.team.tokenizer, self.player_cfg, self.perturber.rules, method_metrics)
        phase_minibatches = build_minibatches(played, ctx)
        if self.cfg.trainer.recompute_old_logprobs:  # π_old := the trainer's own forward (on every rank)
            self.team.recompute_old_logprobs(at.role, [u.batch for u in phase_minibatches])
        records = phase_records(played, ctx)
        self.files.records(records)
        self.state.records += len(records)
        return Phase(at.phase_first, phase_minibatches)

    def _publish(self, role: str, weights: dict[str, Any]) -> None:
        """Stale feedback's copy of ``role``'s weights at an iteration's start, in the run directory."""
        (self.run_dir / rundir.PUBLISHED).mkdir(parents=True, exist_ok=True)
        atomic_torch_save(weights, self.run_dir / rundir.PUBLISHED / f"{role}.pt")
        self.state.published[role] = f"{rundir.PUBLISHED}/{role}.pt"

    def _save(self, at: Update, block_end: bool) -> None:
        """The active player's checkpoint after update ``at``, then the run state that names it."""
        t = time.perf_counter()
        save_active(self.team, at.role, at.iteration, block_end, self.run_dir, self.state.checkpoints,
                    self.cfg.schedule.checkpoint_every_block)
        self.saved = at.index + 1
        self._write_state()
        self.state.timing["checkpoint_s"] += time.perf_counter() - t

    def _write_state(self) -> None:
        self.state.phase = self.phase.first if self.phase is not None else None
        self.state.question_history = list(self.history)
        write_state(self.state, self.run_dir / rundir.STATE, self.team, self.method, self.total,
                    self.dist.world_size, self.cfg)
