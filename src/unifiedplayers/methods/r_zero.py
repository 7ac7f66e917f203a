"""R-Zero (Huang et al., arXiv 2508.05004; Appendix G.1): a Challenger (Planning) and a Solver (Execution) from one
base, no tools (docs/baselines.md: what is kept and what departs).

- Solver: majority-vote pseudo-labels (``majority_vote``), trained only on questions whose self-consistency p̂ lies
  in ``method.extra.solver_band`` (:meth:`RZero.group_shape`), default [0.3, 0.7] (the paper's 3–7 of 10 agreeing).
- Challenger (``r_zero_challenger``, a batch source: the penalty needs the whole batch):

  r_unc(x)  = 1 − 2·|p̂(x) − 1/2|                             (R-Zero paper, uncertainty reward)
  r_rep(x)  = λ·|C(x)|/B                                        (repetition penalty)
  r(x)      = max(0, r_unc(x) − r_rep(x))                       (paper; ``method.extra.reward_form=paper``)
  r(x)      = min(p̂, 1 − p̂) − |C(x)|/B                         (R-Zero's code, caller_penalty.py; ``=code``)

  C(x) is x's cluster among the batch's B well-formed questions: agglomerative, average linkage on the distance
  1 − BLEU, merging below 0.5; λ = ``method.extra.repetition_weight``. BLEU is sacrebleu's sentence BLEU/100 of the
  earlier question against the later one as reference (R-Zero uses NLTK's, smoothed: it clusters short
  near-duplicates less readily).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from unifiedplayers.methods.base import GroupShape, Method, register_method
from unifiedplayers.methods.sources import register_reward_source, self_consistency

if TYPE_CHECKING:
    from unifiedplayers.feedback.pipeline import TaskFeedback

BLEU_DISTANCE_THRESHOLD = 0.5  # R-Zero: distance_threshold=0.5, linkage="average"
SOLVER_BAND = (0.3, 0.7)  # the module docstring says why


def bleu_distance_matrix(questions: Sequence[str]) -> np.ndarray:
    """(B, B) symmetric matrix d_ij = 1 − sentence-BLEU(q_i, [q_j])/100 for i < j, 0 on the diagonal."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    n = len(questions)
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            score = bleu.sentence_score(questions[i], [questions[j]]).score / 100.0
            dist[i, j] = dist[j, i] = 1.0 - float(np.clip(score, 0.0, 1.0))
    return dist


def average_linkage_labels(dist: np.ndarray, threshold: float = BLEU_DISTANCE_THRESHOLD) -> np.ndarray:
    """Flat clusters of average-linkage (UPGMA) clustering on a distance matrix: the two closest clusters merge while
    their distance is strictly below ``threshold`` (sklearn's ``distance_threshold``, R-Zero's setting); a merged
    cluster's distance to k is (|a|·D(a,k) + |b|·D(b,k))/(|a| + |b|) (Lance-Williams). A label per item, numbered by
    first member."""
    d = np.array(dist, dtype=np.float64)
    n = d.shape[0]
    if d.shape != (n, n):
        raise ValueError(f"distance matrix must be square, got {d.shape}")
    members: list[list[int]] = [[i] for i in range(n)]
    sizes = np.ones(n)
    alive = np.ones(n, dtype=bool)
    np.fill_diagonal(d, np.inf)
    while alive.sum() > 1:
        masked = np.where(alive[:, None] & alive[None, :], d, np.inf)
        a, b = np.unravel_index(np.argmin(masked), masked.shape)
        if not masked[a, b] < threshold:
            break
        a, b = min(a, b), max(a, b)
        merged = (sizes[a] * d[a] + sizes[b] * d[b]) / (sizes[a] + sizes[b])
        d[a, :] = d[:, a] = merged
        d[a, a] = np.inf
        sizes[a] += sizes[b]
        members[a] += members[b]
        alive[b] = False
    labels = np.empty(n, dtype=np.int64)
    for label, group in enumerate(sorted((members[i] for i in np.flatnonzero(alive)), key=min)):
        labels[group] = label
    return labels


def cluster_shares(questions: Sequence[str], threshold: float = BLEU_DISTANCE_THRESHOLD) -> np.ndarray:
    """|C(x_i)|/B for each of the B questions of the batch (R-Zero's repetition penalty before λ)."""
    if not questions:
        return np.zeros(0)
    labels = average_linkage_labels(bleu_distance_matrix(list(questions)), threshold)
    counts = np.bincount(labels)
    return counts[labels] / len(questions)


def uncertainty_reward(p_hat: float) -> float:
    """R-Zero / Agent0: r_unc = 1 − 2·|p̂ − 1/2|, 1 at p̂ = 1/2 and 0 at p̂ ∈ {0, 1}."""
    if not 0.0 <= p_hat <= 1.0:
        raise ValueError(f"p_hat={p_hat} outside [0, 1]")
    return 1.0 - 2.0 * abs(p_hat - 0.5)


def challenger_rewards(p_hats: Sequence[float], questions: Sequence[str], form: str = "paper",
                       weight: float = 1.0, threshold: float = BLEU_DISTANCE_THRESHOLD,
                       bonus: Optional[Sequence[float]] = None) -> list[float]:
    """The Challenger reward of each well-formed question of one batch (the module docstring's formulas);
    ``bonus``: a term of each question added before the penalty (Agent0's R_tool; None: none)."""
    bonus = [0.0] * len(p_hats) if bonus is None else list(bonus)
    if not len(p_hats) == len(bonus) == len(questions):
        raise ValueError(f"{len(p_hats)} p_hat values, {len(bonus)} bonus terms for {len(questions)} questions")
    penalty = weight * cluster_shares(questions, threshold)
    if form == "paper":
        return [max(0.0, uncertainty_reward(p) + b - r) for p, b, r in zip(p_hats, bonus, penalty)]
    if form == "code":
        return [min(p, 1.0 - p) + b - r for p, b, r in zip(p_hats, bonus, penalty)]
    raise ValueError(f"method.extra.reward_form={form!r}: paper | code")


@dataclass
class ChallengerSettings:
    """The questioner's within-batch repetition penalty and reward form (R-Zero; Agent0 extends it)."""

    reward_form: str = "paper"  # paper | code (the module docstring's formulas)
    repetition_weight: float = 1.0  # λ of |C|/B (R-Zero's code: 1)
    bleu_distance_threshold: float = BLEU_DISTANCE_THRESHOLD


@dataclass
class RZeroSettings(ChallengerSettings):
    """``method.extra`` of R-Zero."""

    solver_band: list[float] = field(default_factory=lambda: list(SOLVER_BAND))


def challenger_settings(fb: TaskFeedback) -> ChallengerSettings:
    """The running method's Challenger settings (the defaults under a method without them)."""
    return fb.settings if isinstance(fb.settings, ChallengerSettings) else ChallengerSettings()


@register_reward_source("planning", "r_zero_challenger", batch=True)
def r_zero_challenger(feedback: Sequence[TaskFeedback], bonus: Optional[Sequence[float]] = None) -> list[float]:
    """:func:`challenger_rewards` of the phase's tasks, with the running method's settings."""
    if not feedback:
        return []
    s = challenger_settings(feedback[0])
    return challenger_rewards([self_consistency(fb) for fb in feedback], [fb.question for fb in feedback],
                              form=str(s.reward_form), weight=float(s.repetition_weight),
                              threshold=float(s.bleu_distance_threshold), bonus=bonus)


def in_band(p_hat: float, band: Sequence[float]) -> bool:
    lo, hi = (float(x) for x in band)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"self-consistency band {list(band)}: need 0 <= low <= high <= 1")
    return lo <= p_hat <= hi


@register_method("r_zero")
class RZero(Method):
    """R-Zero: the Solver trains only on tasks with p̂ in ``method.extra.solver_band``."""

    Settings = RZeroSettings

    def check(self) -> None:
        super().check()
        in_band(0.5, self.settings.solver_band)  # a malformed band fails at start-up

    def group_shape(self, role: str, fb: TaskFeedback, clip_eps: float) -> GroupShape:
        if role != "execution":
            return GroupShape()
        return GroupShape(keep=in_band(self_consistency(fb), self.settings.solver_band))
