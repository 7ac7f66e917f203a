"""Executable feedback (§3.2, Appendix B): perturb → verdict matrix → rewards, for the tasks of one phase.

This is the one feedback function of the project: the outer loop runs :func:`phase_feedback` once per
sampling phase, and the tests check it (``task_feedback`` is the same function for one task)::

    fbs = phase_feedback(questions, trajectories, verifier_sources, perturber, sandbox, cfg.reward, history)
    fbs[i].rewards.execution   # (K,) Eq. 4      fbs[i].rewards.evaluation  # (M,) Eq. 5
    fbs[i].rewards.planning    # Eq. 2          fbs[i].verdicts            # the verdict matrix (Eq. 9)

Each :class:`TaskFeedback` is also what a method's reward sources read
(:mod:`unifiedplayers.methods.sources`). It imports no torch, no model and no player.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from unifiedplayers import rewards
from unifiedplayers.trajectory import Trajectory
from unifiedplayers.verdict import verdict_matrix


@dataclass
class TaskFeedback:
    """One well-formed task's executable feedback: what every reward source may read about it."""

    rewards: rewards.TaskRewards  # all terms of Eq. 2-5 for this task
    answers: Sequence[Optional[str]]  # the K final answers (None: no answer)
    reward_cfg: Any  # RewardConfig
    verdicts: Any = None  # the VerdictMatrix (None for hand-made feedback in unit tests)
    variants: Sequence[Sequence[Any]] = ()  # (K, P) perturbed trajectories (None where a rule does not apply)
    # Baselines only (the UnifiedPlayers sources never read them):
    tool_calls: Sequence[int] = ()  # tool calls of each of the K trajectories (Agent0's tool bonus)
    expected_answer: Optional[str] = None  # the Planning player's answer (Absolute Zero: the sandbox's)
    question: str = ""
    method_cfg: Any = None  # MethodConfig (tool_bonus, teacher endpoint)
    settings: Any = None  # the method's typed settings (method.extra)
    answer_check: Optional[Callable[[Optional[str]], bool]] = None  # execution-verified tasks (Absolute Zero)
    p_hat: Optional[float] = None  # self-consistency p̂ of the K answers; filled on first use by self_consistency()
    extra: dict[str, Any] = field(default_factory=dict)


def phase_feedback(questions: Sequence[str], trajectories: Sequence[Sequence[Trajectory]],
                   verifier_sources: Optional[Sequence[Sequence[str]]], perturber: Any, sandbox: Any, reward_cfg: Any,
                   history: Sequence[str] = (), *, expected_answers: Optional[Sequence[Optional[str]]] = None,
                   tool_calls: Optional[Sequence[Sequence[int]]] = None, answer_checks: Optional[Sequence[Any]] = None,
                   method_cfg: Any = None, settings: Any = None, show_progress: bool = False) -> list[TaskFeedback]:
    """The feedback of every task of a phase: task i has ``trajectories[i]`` (K) and ``verifier_sources[i]`` (M).

    1. The P perturbations of every trajectory of the phase, in one batch (Appendix F.1); none when
       ``verifier_sources`` is None (a method without verifiers: nothing would check the variants).
    2. The verdict matrix of each task (Eq. 9; the sandbox runs every check).
    3. All terms of Eq. 2-5 (:func:`unifiedplayers.rewards.task_rewards`), R(q) against ``history`` (the
       question history as it stood at the start of the block, §3.3).
    """
    from unifiedplayers.logging import progress

    flat = [t for task in trajectories for t in task]
    if verifier_sources is not None:
        variants_flat = perturber.perturb_many(flat)
    else:
        variants_flat = [[None] * len(perturber.rules) for _ in flat]
        verifier_sources = [[] for _ in questions]
    starts = [sum(len(t) for t in trajectories[:i]) for i in range(len(trajectories))]
    variants = [variants_flat[s:s + len(t)] for s, t in zip(starts, trajectories)]
    verdicts = [verdict_matrix(list(verifier_sources[i]), list(trajectories[i]), variants[i], sandbox)
                for i in progress(range(len(questions)), desc="sandbox: verdicts", enabled=show_progress, position=1)]
    history = list(history)
    out = []
    for i, question in enumerate(questions):
        vm = verdicts[i]
        answers = [t.final_answer for t in trajectories[i]]
        tr = rewards.task_rewards(vm.z_orig, vm.z_adv, vm.valid, vm.num_generated, vm.valid_sources, answers,
                                  question, history, reward_cfg, adv_mask=vm.adv_mask, adv_errors=vm.error_adv)
        out.append(TaskFeedback(
            tr, answers, reward_cfg, verdicts=vm, variants=variants[i],
            tool_calls=list(tool_calls[i]) if tool_calls is not None else [],
            expected_answer=expected_answers[i] if expected_answers is not None else None, question=question,
            method_cfg=method_cfg, settings=settings,
            answer_check=answer_checks[i] if answer_checks is not None else None))
    return out


def task_feedback(question: str, trajectories: Sequence[Trajectory], verifier_sources: Sequence[str], perturber: Any,
                  sandbox: Any, reward_cfg: Any, history: Sequence[str] = (), expected_answer: Optional[str] = None,
                  **kwargs: Any) -> TaskFeedback:
    """:func:`phase_feedback` for one task (``kwargs``: method_cfg, settings)."""
    return phase_feedback([question], [list(trajectories)], [list(verifier_sources)], perturber, sandbox, reward_cfg,
                          history, expected_answers=[expected_answer], **kwargs)[0]
