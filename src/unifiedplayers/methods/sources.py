"""Reward sources: the named reward functions a method's config picks for each player (``method.<role>_reward``),
the one way a method gets a player's rewards. A source reads one task's
:class:`unifiedplayers.feedback.pipeline.TaskFeedback`, or, registered with ``batch=True``, the list of all the
phase's tasks (R-Zero's and Agent0's within-batch repetition penalty)::

    @register_reward_source("planning", "my_curriculum")
    def my_curriculum(fb: TaskFeedback) -> float: ...

An Evaluation source returns one reward per generated verifier (M,), while the terms of Eq. 5 (``fb.terms.gold``,
``adv``, ``red``) have one per valid verifier: :func:`unifiedplayers.feedback.rewards.per_generated` spreads them.
``reads_verdicts=True`` marks a source that reads the verdict matrix (a method with ``verifiers: false``
may not train with it); ``check(method_cfg)`` runs at start-up when the source is chosen.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from unifiedplayers.registry import Registry
from unifiedplayers.feedback.rewards import answer_clusters, majority_share
from unifiedplayers.roles import ROLES


@dataclass(frozen=True)
class RewardSource:
    """One named reward function of one role."""

    fn: Callable[[Any], Any]
    batch: bool = False  # fn(list of TaskFeedback) -> one reward per task
    reads_verdicts: bool = False
    check: Optional[Callable[[Any], None]] = None  # check(method_cfg) at start-up

    def __call__(self, feedback: Any) -> Any:
        return self.fn(feedback)

    @property
    def __wrapped__(self) -> Callable[[Any], Any]:  # where the source is defined (the registry's messages)
        return self.fn

    def over(self, feedback: Sequence[Any]) -> list[Any]:
        """The rewards of every task of a phase, in task order."""
        feedback = list(feedback)
        if not self.batch:
            return [self.fn(fb) for fb in feedback]
        out = list(self.fn(feedback))
        if len(out) != len(feedback):
            raise ValueError(f"reward source {self.fn.__name__} returned {len(out)} rewards for {len(feedback)} tasks")
        return out


REWARD_SOURCES: dict[str, Registry] = {role: Registry(f"{role} reward source") for role in ROLES}
# The baselines in this package, imported on first use (they import this package; it never imports them).
BUILTIN_MODULES = {name: f"unifiedplayers.methods.{name}" for name in ("r_zero", "agent0", "absolute_zero",
                                                                        "socratic_zero")}


def register_reward_source(role: str, name: str, *, batch: bool = False, reads_verdicts: bool = False,
                           check: Optional[Callable[[Any], None]] = None):
    """Register ``fn`` as ``role``'s reward source ``name`` (see the module docstring)."""
    if role not in REWARD_SOURCES:
        raise ValueError(f"unknown role {role!r}; roles: {ROLES}")

    def deco(fn):
        REWARD_SOURCES[role].register(name, RewardSource(fn, batch, reads_verdicts, check), stacklevel=2)
        return fn

    return deco


def reward_source(role: str, name: str) -> RewardSource:
    """``role``'s source ``name``; an unknown name fails naming the known ones (the baselines' included).
    ``"module:name"``: a source registered outside the package, by importing ``module`` (on ``PYTHONPATH``)."""
    if role not in REWARD_SOURCES:
        raise ValueError(f"unknown role {role!r}; roles: {ROLES}")
    module, sep, short = name.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):  # the module itself imports something missing
                raise
            raise ValueError(f"method.{role}_reward={name!r}: cannot import {module!r} ({err}); put the folder "
                             "that holds it on PYTHONPATH") from None
        found = REWARD_SOURCES[role].get(short, None)
        if found is None or getattr(found.fn, "__module__", None) != module:
            raise ValueError(f"method.{role}_reward={name!r}: {module} registers no {role} reward source {short!r}")
        return found
    if name not in REWARD_SOURCES[role]:  # a baseline's source registers when its module is imported
        import_builtin_methods()
    return REWARD_SOURCES[role].get(name)


def import_builtin_methods() -> None:
    """Import every baseline of the package (their methods and reward sources register)."""
    for module in BUILTIN_MODULES.values():
        importlib.import_module(module)


def self_consistency(fb: Any) -> float:
    """p̂: share of the K samples that give the majority answer (R-Zero / Agent0), K counting every sample. Computed
    once per task and kept on ``fb``, with the reward config's clustering options (p̂ agrees with the record's U(q))."""
    if fb.p_hat is None:
        c = fb.reward_cfg
        fb.p_hat = float(majority_share(list(fb.answers), bool(getattr(c, "missing_answer_in_majority", False)),
                                        getattr(c, "answer_match_timeout_s", 10.0)))
    return fb.p_hat


# UnifiedPlayers' sources, and the pseudo-label reward shared by R-Zero and Agent0

@register_reward_source("execution", "verdict", reads_verdicts=True)
def execution_verdict(fb: Any) -> np.ndarray:
    """Eq. 4: r_S(τ_k) = share of the valid verifiers that accept τ_k. Shape (K,)."""
    return np.asarray(fb.terms.execution, dtype=np.float64)


@register_reward_source("execution", "majority_vote")
def execution_majority_vote(fb: Any) -> np.ndarray:
    """Pseudo-label reward (R-Zero / Agent0 Executor): 1 for answers in the largest answer cluster, else 0.
    Ties go to the cluster met first; no answer at all gives zeros."""
    clusters = answer_clusters(list(fb.answers))
    out = np.zeros(len(fb.answers))
    if clusters:
        out[max(clusters, key=len)] = 1.0
    return out


@register_reward_source("planning", "unifiedplayers", reads_verdicts=True)
def planning_unifiedplayers(fb: Any) -> float:
    """Eq. 2: r_T(q) = w_unc U(q) + w_ver V(q) − w_rep R(q)."""
    return float(fb.terms.planning)


@register_reward_source("planning", "uncertainty_repetition")
def planning_uncertainty_repetition(fb: Any) -> float:
    """w_unc U(q) − w_rep R(q), R(q) against the history (no verifier term; R-Zero's own reward, with the
    within-batch penalty, is ``r_zero_challenger``)."""
    c = fb.reward_cfg
    return float(c.w_unc * fb.terms.uncertainty - c.w_rep * fb.terms.repetition)


@register_reward_source("evaluation", "verdict", reads_verdicts=True)
def evaluation_verdict(fb: Any) -> np.ndarray:
    """Eq. 5 for the valid verifiers, ``invalid_verifier_reward`` for the others. Shape (M,)."""
    return np.asarray(fb.terms.evaluation, dtype=np.float64)
