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
OpenAI-compatible endpoint grades the Solver), :mod:`~unifiedplayers.methods.r_zero` (Challenger reward with
the within-batch BLEU-cluster penalty, the Solver's self-consistency band).
A source that needs something from the config at start-up declares it with :func:`requires`.

Two more hooks for the outer loop, both pure functions of the update's feedback:

- :func:`planning_rewards` ``(method_cfg, feedback) -> list[float]``: the Planning reward of every
  well-formed task of one update. A source registered with :func:`register_batch_planning_source`
  sees the whole batch (R-Zero's and Agent0's repetition penalty cluster the batch's questions);
  a per-task source is mapped over it.
- :func:`group_shape` ``(method_cfg, role, fb, clip_eps) -> GroupShape``: how the method trains one
  task's group: kept or dropped (R-Zero's band, Agent0's frontier), its advantages scaled and its
  per-sample upper clip (Agent0's ADPO); :func:`shape_advantages` applies the shapes to a batch's
  advantages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from unifiedplayers.rewards import TaskRewards, answer_clusters, majority_share

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
    p_hat: Optional[float] = None  # self-consistency p̂ of the K answers; filled on first use by self_consistency()


def self_consistency(fb: TaskFeedback) -> float:
    """p̂: share of the K samples that give the majority answer (R-Zero / Agent0), K counting every sample.

    Computed once per task (answer matching runs math-verify) and kept on ``fb``; the clustering options
    (missing answers, time limit) are the reward config's, so p̂ agrees with the U(q) of the record.
    """
    if fb.p_hat is None:
        c = fb.reward_cfg
        fb.p_hat = float(majority_share(list(fb.answers), bool(getattr(c, "missing_answer_in_majority", False)),
                                        getattr(c, "answer_match_timeout_s", 10.0)))
    return fb.p_hat


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
    """w_unc U(q) − w_rep R(q), R(q) against the history (no verifier term; R-Zero's own reward, with the
    within-batch penalty, is ``r_zero_challenger``)."""
    c = fb.reward_cfg
    return float(c.w_unc * fb.rewards.uncertainty - c.w_rep * fb.rewards.repetition)


@register_reward_source("evaluation", "verdict")
def evaluation_verdict(fb: TaskFeedback) -> np.ndarray:
    """Eq. 5 for the valid verifiers, ``invalid_verifier_reward`` for the others. Shape (M,)."""
    return np.asarray(fb.rewards.evaluation, dtype=np.float64)


# ------------------------------------------------------------------ batch-level Planning rewards

BATCH_PLANNING_SOURCES: dict[str, Callable[[Sequence[TaskFeedback]], Sequence[float]]] = {}


def register_batch_planning_source(name: str, per_task_fallback: Optional[Callable[[TaskFeedback], float]] = None):
    """Register ``fn(feedback: list[TaskFeedback]) -> one reward per task`` as Planning source ``name``.

    ``per_task_fallback`` is what an outer loop that still calls the source task by task gets (with a
    warning, once): a batch penalty cannot be computed from one task.
    """

    def deco(fn):
        BATCH_PLANNING_SOURCES[name] = fn
        warned = []

        def per_task(fb: TaskFeedback) -> float:
            if per_task_fallback is None:
                raise ValueError(f"planning reward {name!r} needs the whole batch: call "
                                 "unifiedplayers.methods.planning_rewards(method_cfg, feedback)")
            if not warned:
                import logging

                logging.getLogger(__name__).warning(
                    "planning reward %r called task by task: its within-batch repetition penalty is replaced by "
                    "R(q) against the history until the outer loop calls methods.planning_rewards", name)
                warned.append(True)
            return float(per_task_fallback(fb))

        REWARD_SOURCES["planning"][name] = per_task
        return fn

    return deco


def planning_rewards(method_cfg: Any, feedback: Sequence[TaskFeedback]) -> list[float]:
    """The Planning reward of each well-formed task of one sampling phase (``feedback`` in task order):
    a batch source's "batch" (R-Zero's and Agent0's within-batch repetition penalty) is the phase's tasks.

    A batch source (R-Zero, Agent0) gets the whole list; any other source is called task by task.
    """
    name = method_cfg.planning_reward
    feedback = list(feedback)
    if name in BATCH_PLANNING_SOURCES:
        out = [float(r) for r in BATCH_PLANNING_SOURCES[name](feedback)]
        if len(out) != len(feedback):
            raise ValueError(f"planning reward {name!r} returned {len(out)} rewards for {len(feedback)} tasks")
        return out
    source = reward_source("planning", name)
    return [float(source(fb)) for fb in feedback]


# ------------------------------------------------------------------ how a method trains one group


@dataclass
class GroupShape:
    """How the method trains one task's group (the K trajectories of a task, or a prompt's G_T tasks)."""

    keep: bool = True  # False: the group is not trained on (R-Zero's band, Agent0's frontier)
    adv_scale: float = 1.0  # multiplies the group's GRPO advantages (Agent0's ADPO)
    clip_high: Optional[float] = None  # per-sample upper clip ε_high (Agent0's ADPO); None: trainer.clip_eps


GROUP_SHAPES: dict[str, Callable[[Any, str, TaskFeedback, float], GroupShape]] = {}


def register_group_shape(method_name: str):
    """Register ``fn(method_cfg, role, fb, clip_eps) -> GroupShape`` for the method named ``method_name``."""

    def deco(fn):
        GROUP_SHAPES[method_name] = fn
        return fn

    return deco


def group_shape(method_cfg: Any, role: str, fb: TaskFeedback, clip_eps: float = 0.2) -> GroupShape:
    """The shape of one task's group for ``role`` under the method (plain GRPO: keep, scale 1, no own clip).

    ``clip_eps`` is the trainer's ε of the role (ADPO widens the upper bound from it).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {ROLES}")
    fn = GROUP_SHAPES.get(str(getattr(method_cfg, "name", "")))
    return GroupShape() if fn is None else fn(method_cfg, role, fb, float(clip_eps))


def shape_advantages(shapes: dict[int, GroupShape], group_ids: Sequence[int],
                     advantages: Sequence[float]) -> list[tuple[int, float, Optional[float]]]:
    """Apply each group's shape to its samples' GRPO advantages (Eq. 17 first, then the method's shape).

    ``shapes[g]`` is the shape of group ``g`` (a group without one is plain GRPO); ``group_ids[n]`` and
    ``advantages[n]`` belong to sample ``n``. Returns ``(n, adv_scale·Â_n, clip_high)`` for every sample
    of a kept group, in sample order.
    """
    if len(group_ids) != len(advantages):
        raise ValueError(f"{len(group_ids)} group ids for {len(advantages)} advantages")
    out = []
    for n, (g, a) in enumerate(zip(group_ids, advantages)):
        shape = shapes.get(g, GroupShape())
        if shape.keep:
            out.append((n, float(shape.adv_scale) * float(a), shape.clip_high))
    return out


def method_extra(method_cfg: Any, key: str, default: Any) -> Any:
    """``method.extra[key]`` or ``default`` (method_cfg may be None in unit tests)."""
    extra = getattr(method_cfg, "extra", None) or {}
    return extra.get(key, default)


# ------------------------------------------------------------------ a method's own loop


class MethodLoop:
    """A baseline whose loop is more than a reward and a group shape (Socratic-Zero: a Teacher's curriculum,
    preference pairs, imitation). The outer loop calls it at a few marked points of a sampling phase:

    - :meth:`planning_prompts` before the Planning player writes the phase's tasks (None: the topic prompts);
    - :meth:`phase_tasks` after, to choose the tasks played (every rank gets rank 0's choice);
    - :meth:`after_rollouts` (rank 0) once the Execution player's K solutions are in;
    - :meth:`unit_batch` for each unit's training batch (None: the GRPO groups), :meth:`unit_metrics`
      and :meth:`record_meta` for its metrics line and records;
    - :meth:`state_dict` / :meth:`load_state_dict` with the run state (resume stays exact).

    The defaults change nothing.
    """

    def planning_prompts(self, tokenizer: Any, player_cfg: Any, n: int) -> Optional[list[tuple[str, str]]]:
        return None

    def phase_tasks(self, role: str, groups: list, used: list, unused: list, n: int) -> tuple[list, list, list]:
        return groups, used, unused

    def after_rollouts(self, role: str, tasks: Sequence[Any], rollouts: Sequence[Sequence[Any]]) -> None:
        pass

    def unit_batch(self, role: str, task_indices: Sequence[int], tokenizer: Any, player_cfg: Any) -> Optional[list]:
        return None

    def unit_metrics(self, role: str, task_indices: Sequence[int]) -> dict[str, Any]:
        return {}

    def record_meta(self, task_index: int) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


METHOD_LOOPS: dict[str, Callable[[Any], MethodLoop]] = {}  # method name -> factory(cfg)


def register_method_loop(method_name: str):
    """Register ``factory(cfg) -> MethodLoop`` for the method named ``method_name``."""

    def deco(factory):
        METHOD_LOOPS[method_name] = factory
        return factory

    return deco


def method_loop(cfg: Any) -> Optional[MethodLoop]:
    """The method's own loop for the run config ``cfg`` (its start-up checks run here); None for a method
    that needs none."""
    factory = METHOD_LOOPS.get(str(getattr(cfg.method, "name", "")))
    return None if factory is None else factory(cfg)


# The baselines' sources register themselves (imported last: they use the registry above).
from unifiedplayers.methods import absolute_zero, agent0, r_zero, socratic_zero  # noqa: E402,F401
