"""Executable feedback (§3.2, Appendix B): perturb → verdict matrix → rewards, for the tasks of one phase.

The outer loop runs :func:`phase_feedback` once per sampling phase; each :class:`TaskFeedback` (``terms.execution``
(K,) Eq. 4, ``terms.evaluation`` (M,) Eq. 5, ``terms.planning`` Eq. 2, ``verdicts`` Eq. 9) is what a method's
reward sources read (:mod:`unifiedplayers.methods.sources`). No torch, no model, no player.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

from unifiedplayers.feedback import rewards
from unifiedplayers.feedback.trajectory import Trajectory
from unifiedplayers.feedback.verdict import verdict_matrix


@dataclass
class TaskFeedback:
    """One well-formed task's executable feedback: what every reward source may read about it."""

    terms: rewards.TaskRewards  # all terms of Eq. 2-5 for this task (what trains a player: the method's sources)
    answers: Sequence[Optional[str]]  # the K final answers (None: no answer)
    reward_cfg: Any  # RewardConfig
    verdicts: Any = None  # the VerdictMatrix (None for hand-made feedback in unit tests)
    variants: Sequence[Sequence[Any]] = ()  # (K, P) perturbed trajectories (None where a rule does not apply)
    # Baselines only (the UnifiedPlayers sources never read them):
    tool_calls: Sequence[int] = ()  # tool calls of each of the K trajectories (Agent0's tool bonus)
    expected_answer: Optional[str] = None  # the Planning player's answer (Absolute Zero: the sandbox's)
    question: str = ""
    method_cfg: Any = None  # MethodConfig
    settings: Any = None  # the method's typed settings (method.extra: Agent0's tool_bonus, Socratic-Zero's Teacher)
    answer_check: Optional[Callable[[Optional[str]], bool]] = None  # execution-verified tasks (Absolute Zero)
    p_hat: Optional[float] = None  # self-consistency p̂ of the K answers; filled on first use by self_consistency()
    extra: dict[str, Any] = field(default_factory=dict)


class FeedbackTask(Protocol):
    """What the feedback reads of one played task (:class:`unifiedplayers.loop.sampling.PlayedTask` is one)."""

    question: str
    trajectories: Sequence[Trajectory]  # the K trajectories
    verifier_sources: Sequence[str]  # the M verifiers' outputs (none for a method without verifiers)
    expected_answer: Optional[str]  # the Planning player's answer (Absolute Zero: the sandbox's)
    tool_calls: Sequence[int]  # tool calls of each trajectory (Agent0's tool bonus)
    answer_check: Optional[Callable[[Optional[str]], bool]]  # execution-verified tasks (Absolute Zero)


@dataclass
class FeedbackContext:
    """What the feedback of a phase reads besides its tasks; ``history`` is R(q)'s question history as it stood at
    the start of the block (§3.3)."""

    perturber: Any
    sandbox: Any
    reward_cfg: Any  # RewardConfig
    history: Sequence[str] = ()
    verifiers: bool = True  # False: a method without verifiers (no perturbations: nothing would check them)
    method_cfg: Any = None
    settings: Any = None
    # Wraps the tasks' verdict stage for a progress display: progress(items, description) -> the same items, in
    # order (the loop passes a tqdm bar; the feedback core imports no display of its own).
    progress: Optional[Callable[[Sequence[Any], str], Any]] = None


def phase_feedback(tasks: Sequence[FeedbackTask], ctx: FeedbackContext) -> list[TaskFeedback]:
    """The feedback of every task of a phase, in task order: the P perturbations of every trajectory in one batch
    (Appendix F.1; none without verifiers), each task's verdict matrix (Eq. 9), then all terms of Eq. 2-5
    (:func:`~unifiedplayers.feedback.rewards.task_rewards`)."""
    flat = [t for task in tasks for t in task.trajectories]
    if ctx.verifiers:
        variants_flat = iter(ctx.perturber.perturb_many(flat))
    else:
        variants_flat = iter([[None] * len(ctx.perturber.rules) for _ in flat])
    variants = [[next(variants_flat) for _ in task.trajectories] for task in tasks]
    items = list(zip(tasks, variants))
    verdicts = [verdict_matrix(list(task.verifier_sources) if ctx.verifiers else [], list(task.trajectories),
                               task_variants, ctx.sandbox)
                for task, task_variants in (ctx.progress(items, "sandbox: verdicts") if ctx.progress else items)]
    history = list(ctx.history)
    return [_task_feedback(task, vm, task_variants, history, ctx)
            for task, vm, task_variants in zip(tasks, verdicts, variants)]


def _task_feedback(task: FeedbackTask, vm: Any, variants: Sequence[Sequence[Any]], history: list[str],
                   ctx: FeedbackContext) -> TaskFeedback:
    answers = [t.final_answer for t in task.trajectories]
    tr = rewards.task_rewards(vm.z_orig, vm.z_adv, vm.valid, vm.num_generated, vm.valid_sources, answers,
                              task.question, history, ctx.reward_cfg, adv_mask=vm.adv_mask, adv_errors=vm.error_adv)
    return TaskFeedback(tr, answers, ctx.reward_cfg, verdicts=vm, variants=variants,
                        tool_calls=list(task.tool_calls), expected_answer=task.expected_answer,
                        question=task.question, method_cfg=ctx.method_cfg, settings=ctx.settings,
                        answer_check=task.answer_check)
