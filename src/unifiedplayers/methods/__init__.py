"""Reward sources of each role, by name (``cfg.method``; SPEC §11: baselines are compositions).

The outer loop (:mod:`unifiedplayers.schedule`) computes every task's verdict matrix and
:func:`unifiedplayers.rewards.task_rewards`, then asks the reward source named by the method for each
role's rewards. UnifiedPlayers uses ``verdict`` (Eq. 4, 5) and ``unifiedplayers`` (Eq. 2); a baseline
such as Agent0 or R-Zero registers its own sources (e.g. ``majority_vote`` for Execution) and is a new
``conf/method/*.yaml``, not a copy of the loop::

    @register_reward_source("planning", "my_curriculum")
    def my_curriculum(fb: TaskFeedback) -> float: ...

The baselines' own sources live in submodules (SPEC §11), registered on import below:
:mod:`~unifiedplayers.methods.agent0` (Curriculum reward with the tool-call bonus),
:mod:`~unifiedplayers.methods.absolute_zero` (learnability and exact-answer rewards, code-reasoning tasks
validated in the sandbox), :mod:`~unifiedplayers.methods.socratic_zero` (a Teacher behind an
OpenAI-compatible endpoint grades the Solver). R-Zero is a pure composition of the sources here
(``uncertainty_repetition`` with ``reward.repetition_mode=cluster_share``, ``majority_vote``).
A source that needs something from the config at start-up declares it with :func:`requires`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from unifiedplayers.rewards import TaskRewards, answer_clusters

ROLES = ("planning", "execution", "evaluation")
REWARD_SOURCES: dict[str, dict[str, Callable[["TaskFeedback"], Any]]] = {role: {} for role in ROLES}


@dataclass
class TaskFeedback:
    """What a reward source may read about one well-formed task."""

    rewards: TaskRewards  # all terms of Eq. 2-5 for this task
    answers: Sequence[Optional[str]]  # the K final answers (None: no answer)
    reward_cfg: Any  # RewardConfig
    # Baselines only (the UnifiedPlayers sources never read them):
    tool_calls: Sequence[int] = ()  # tool calls of each of the K trajectories (Agent0's tool bonus)
    expected_answer: Optional[str] = None  # the Planning player's answer (Absolute Zero: the sandbox's)
    question: str = ""
    method_cfg: Any = None  # MethodConfig (tool_bonus, teacher endpoint, extra)
    answer_check: Optional[Callable[[Optional[str]], bool]] = None  # execution-verified tasks (Absolute Zero)


def register_reward_source(role: str, name: str):
    if role not in REWARD_SOURCES:
        raise ValueError(f"unknown role {role!r}; roles: {ROLES}")

    def deco(fn):
        REWARD_SOURCES[role][name] = fn
        return fn

    return deco


STARTUP_CHECKS: dict[str, Callable[[Any], None]] = {}  # source name -> check(method_cfg), run at start-up


def requires(name: str, check: Callable[[Any], None]) -> None:
    """Register a start-up check of the method config for reward source ``name`` (raises with a clear message)."""
    STARTUP_CHECKS[name] = check


# How a Planning output becomes a task (``method.extra.task_format``): ``math`` (the default) keeps the
# parsed question and boxed answer; a builder ``(task, sandbox) -> task`` rebuilds it (Absolute Zero's
# ``code_reasoning``: a proposed program validated and answered in the sandbox).
TASK_BUILDERS: dict[str, Callable[[Any, Any], Any]] = {"math": lambda task, sandbox: task}


def register_task_builder(name: str, fn: Callable[[Any, Any], Any]) -> None:
    TASK_BUILDERS[name] = fn


def task_builder(method_cfg: Any) -> Callable[[Any, Any], Any]:
    name = str((method_cfg.extra or {}).get("task_format", "math"))
    if name not in TASK_BUILDERS:
        raise ValueError(f"method.extra.task_format={name!r}: known {sorted(TASK_BUILDERS)}")
    return TASK_BUILDERS[name]


def reward_source(role: str, name: str) -> Callable[[TaskFeedback], Any]:
    try:
        return REWARD_SOURCES[role][name]
    except KeyError:
        raise ValueError(
            f"method: unknown {role} reward source {name!r}; known: {sorted(REWARD_SOURCES.get(role, {}))}"
        ) from None


# (role, source) pairs that read the verdict matrix: a method with ``verifiers: false`` may not train with them.
VERDICT_SOURCES = {("execution", "verdict"), ("planning", "unifiedplayers"), ("evaluation", "verdict")}


def method_reward_sources(method_cfg: Any) -> dict[str, Callable[[TaskFeedback], Any]]:
    """The three reward functions named by ``cfg.method`` (fails at start-up on an unknown name)."""
    unknown = [r for r in method_cfg.roles if r not in ROLES]
    if unknown:
        raise ValueError(f"method.roles: unknown roles {unknown}; roles: {ROLES}")
    sources = {
        "planning": reward_source("planning", method_cfg.planning_reward),
        "execution": reward_source("execution", method_cfg.execution_reward),
        "evaluation": reward_source("evaluation", method_cfg.evaluation_reward),
    }
    if not getattr(method_cfg, "verifiers", True):
        needing = [f"{role}_reward={getattr(method_cfg, role + '_reward')}" for role in method_cfg.roles
                   if (role, getattr(method_cfg, role + "_reward")) in VERDICT_SOURCES]
        if needing:
            raise ValueError(f"method.verifiers=false, but the trained roles' rewards read verdicts: "
                             f"{', '.join(needing)}")
    for name in {method_cfg.planning_reward, method_cfg.execution_reward, method_cfg.evaluation_reward}:
        if name in STARTUP_CHECKS:
            STARTUP_CHECKS[name](method_cfg)
    return sources


@register_reward_source("execution", "verdict")
def execution_verdict(fb: TaskFeedback) -> np.ndarray:
    """Eq. 4: r_S(τ_k) = share of the valid verifiers that accept τ_k. Shape (K,)."""
    return np.asarray(fb.rewards.execution, dtype=np.float64)


@register_reward_source("execution", "majority_vote")
def execution_majority_vote(fb: TaskFeedback) -> np.ndarray:
    """Pseudo-label reward (R-Zero / Agent0 Executor): 1 for answers in the largest answer cluster, else 0.
    Ties go to the cluster met first; no answer at all gives zeros."""
    clusters = answer_clusters(list(fb.answers))
    out = np.zeros(len(fb.answers))
    if clusters:
        out[max(clusters, key=len)] = 1.0
    return out


@register_reward_source("planning", "unifiedplayers")
def planning_unifiedplayers(fb: TaskFeedback) -> float:
    """Eq. 2: r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q)."""
    return float(fb.rewards.planning)


@register_reward_source("planning", "uncertainty_repetition")
def planning_uncertainty_repetition(fb: TaskFeedback) -> float:
    """R-Zero-like Challenger reward: w_unc U(q) − w_rep R(q) (no verifier term)."""
    c = fb.reward_cfg
    return float(c.w_unc * fb.rewards.uncertainty - c.w_rep * fb.rewards.repetition)


@register_reward_source("evaluation", "verdict")
def evaluation_verdict(fb: TaskFeedback) -> np.ndarray:
    """Eq. 5 for the valid verifiers, ``invalid_verifier_reward`` for the others. Shape (M,)."""
    return np.asarray(fb.rewards.evaluation, dtype=np.float64)


# The baselines' sources register themselves (imported last: they use the registry above).
from unifiedplayers.methods import absolute_zero, agent0, socratic_zero  # noqa: E402,F401
