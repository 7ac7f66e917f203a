"""R-Zero (arXiv 2508.05004): the Challenger's uncertainty and within-batch repetition penalty, and the Solver's
self-consistency band, against numbers worked out by hand."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from unifiedplayers.config import compose
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import GroupShape, build_method, reward_source, self_consistency
from unifiedplayers.methods import r_zero

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def cfg():
    return compose(["method=r_zero"])


@pytest.fixture(scope="module")
def method(cfg):
    return build_method(cfg)


def feedback(answers=(), *, question="q", method=None, p_hat=None, reward_cfg=None, repetition=0.0, settings=None):
    rewards = SimpleNamespace(uncertainty=None, repetition=repetition)
    return TaskFeedback(rewards, list(answers), reward_cfg, question=question, method_cfg=method, p_hat=p_hat,
                        settings=settings)


def test_average_linkage_on_a_hand_made_distance_matrix():
    # a, b at 0.2; b, c at 0.4; a, c at 0.7. Merge {a, b} at 0.2, then the mean distance to c is
    # (0.7 + 0.4)/2 = 0.55 >= 0.5: c stays alone (single linkage would merge at 0.4, complete never).
    d = np.array([[0, .2, .7], [.2, 0, .4], [.7, .4, 0]])
    assert r_zero.average_linkage_labels(d).tolist() == [0, 0, 1]
    # with a, c at 0.5 the mean is (0.5 + 0.4)/2 = 0.45 < 0.5: one cluster
    d[0, 2] = d[2, 0] = 0.5
    assert r_zero.average_linkage_labels(d).tolist() == [0, 0, 0]
    # the threshold itself does not merge (sklearn's distance_threshold, R-Zero's setting)
    assert r_zero.average_linkage_labels(np.array([[0, .5], [.5, 0]])).tolist() == [0, 1]
    assert r_zero.average_linkage_labels(np.array([[0, .49], [.49, 0]])).tolist() == [0, 0]
    # two pairs far apart: labels numbered by first member
    d4 = np.full((4, 4), 0.9)
    np.fill_diagonal(d4, 0)
    d4[1, 3] = d4[3, 1] = 0.1
    d4[0, 2] = d4[2, 0] = 0.3
    assert r_zero.average_linkage_labels(d4).tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="square"):
        r_zero.average_linkage_labels(np.zeros((2, 3)))


def test_bleu_distance_by_hand():
    # "a b c d" against "a b c e": n-gram precisions 3/4, 2/3, 1/2 and 0/1 for 4-grams, which sacrebleu's
    # exponential smoothing makes 1/(2·1); same length, so BP = 1 and
    # BLEU = (3/4 · 2/3 · 1/2 · 1/2)^(1/4) = (1/8)^(1/4) = 0.5946, d = 1 − 0.5946 = 0.4054.
    d = r_zero.bleu_distance_matrix(["a b c d", "a b c e", "x y z w", "a b c d"])
    assert d[0, 1] == pytest.approx(1 - 8 ** -0.25, abs=1e-9)
    assert d[0, 2] == 1.0  # no word in common: BLEU 0
    assert d[0, 3] == pytest.approx(0.0, abs=1e-12)  # the same question: BLEU 1
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)


def test_cluster_shares_by_hand():
    # d(q0, q3) = 0 merges first; the mean distance of {q0, q3} to q1 is (0.4054 + 0.4054)/2 < 0.5, so q1
    # joins; q2 is at distance 1 from all. Shares |C|/B: 3/4, 3/4, 1/4, 3/4.
    shares = r_zero.cluster_shares(["a b c d", "a b c e", "x y z w", "a b c d"])
    assert shares.tolist() == [0.75, 0.75, 0.25, 0.75]
    assert r_zero.cluster_shares([]).tolist() == []
    assert r_zero.cluster_shares(["only one"]).tolist() == [1.0]


QUESTIONS = ["a b c d", "a b c e", "x y z w", "a b c d"]


def test_challenger_reward_paper_and_code_forms_by_hand():
    p = [0.5, 0.25, 0.5, 1.0]
    # paper: r_unc = 1 − 2|p − 1/2| = 1, 0.5, 1, 0; minus the shares 0.75, 0.75, 0.25, 0.75, floored at 0
    assert r_zero.challenger_rewards(p, QUESTIONS) == pytest.approx([0.25, 0.0, 0.75, 0.0])
    # code (caller_penalty.py): min(p, 1 − p) − share = 0.5 − 0.75, 0.25 − 0.75, 0.5 − 0.25, 0 − 0.75
    assert r_zero.challenger_rewards(p, QUESTIONS, form="code") == pytest.approx([-0.25, -0.5, 0.25, -0.75])
    # λ = 0.5: 1 − 0.375, 0.5 − 0.375, 1 − 0.125, max(0, −0.375)
    assert r_zero.challenger_rewards(p, QUESTIONS, weight=0.5) == pytest.approx([0.625, 0.125, 0.875, 0.0])
    with pytest.raises(ValueError, match="reward_form"):
        r_zero.challenger_rewards(p, QUESTIONS, form="nope")
    with pytest.raises(ValueError, match="outside"):
        r_zero.uncertainty_reward(1.5)


def test_planning_rewards_of_a_batch_from_real_answers(cfg, method):
    # K = 4 answers per task; p̂ = largest answer cluster / 4 (math-verify: 1/2 ≡ 0.5), missing answers count in K:
    # 0.5, 0.25, 0.5, 1.0 (the hand-worked batch above)
    answers = [["0.5", "\\frac{1}{2}", "3", "4"], ["1", "2", "3", None], ["7", "7", "8", "8"], ["5", "5", "5", "5"]]
    fbs = [feedback(a, question=q, method=cfg.method, reward_cfg=cfg.reward, settings=method.settings)
           for a, q in zip(answers, QUESTIONS)]
    assert isinstance(method, r_zero.RZero) and reward_source("planning", "r_zero_challenger").batch
    assert method.source("planning").over(fbs) == pytest.approx([0.25, 0.0, 0.75, 0.0])
    assert [fb.p_hat for fb in fbs] == [0.5, 0.25, 0.5, 1.0]  # kept for the group shape
    assert method.source("planning").over([]) == []
    # the settings travel on the feedback: λ = 0.5 gives the λ = 0.5 row of the hand-worked batch above
    half = r_zero.RZeroSettings(repetition_weight=0.5)
    fbs = [feedback(a, question=q, reward_cfg=cfg.reward, settings=half) for a, q in zip(answers, QUESTIONS)]
    assert reward_source("planning", "r_zero_challenger").over(fbs) == pytest.approx([0.625, 0.125, 0.875, 0.0])


def test_solver_trains_only_inside_the_band(cfg, method):
    m = method
    assert list(cfg.method.extra["solver_band"]) == [0.3, 0.7] and list(m.settings.solver_band) == [0.3, 0.7]
    for p, keep in [(0.3, True), (0.5, True), (0.7, True), (0.25, False), (0.75, False), (1.0, False), (0.0, False)]:
        assert m.group_shape("execution", feedback(p_hat=p), 0.2) == GroupShape(keep=keep), p
    # the Challenger's groups are never dropped; plain GRPO otherwise
    assert m.group_shape("planning", feedback(p_hat=1.0), 0.2) == GroupShape()
    assert build_method(compose([])).group_shape("execution", feedback(p_hat=1.0), 0.2) == GroupShape()
    # p̂ from ten answers: 3 of 10 agree -> 0.3, inside; 2 of 10 -> 0.2, outside
    three = feedback(["4", "4", "4", "1", "2", "3", "5", "6", "7", "8"], reward_cfg=cfg.reward)
    assert self_consistency(three) == 0.3 and m.group_shape("execution", three, 0.2).keep
    two = feedback(["4", "4", "9", "1", "2", "3", "5", "6", "7", "8"], reward_cfg=cfg.reward)
    assert self_consistency(two) == 0.2 and not m.group_shape("execution", two, 0.2).keep
    with pytest.raises(ValueError, match="band"):
        r_zero.in_band(0.5, [0.7, 0.3])
    # a malformed band fails at start-up, not at the first group
    with pytest.raises(ValueError, match="band"):
        build_method(compose(["method=r_zero", "method.extra.solver_band=[0.7,0.3]"]))
    with pytest.raises(ValueError, match="unknown role"):
        build_method(compose(["method=r_zero", "method.roles=[judge]"]))


def test_config_sets_what_r_zero_needs(cfg):
    assert cfg.method.planning_reward == "r_zero_challenger" and cfg.method.execution_reward == "majority_vote"
    assert cfg.reward.malformed_task_reward == 0.0  # R-Zero's format check
    assert cfg.method.extra["reward_form"] == "paper" and cfg.method.extra["repetition_weight"] == 1.0
    assert not cfg.method.use_tools


def test_planning_rewards_maps_a_per_task_source_and_checks_a_batch_source(monkeypatch):
    from unifiedplayers import methods

    up = build_method(compose([]))  # UnifiedPlayers: Eq. 2 per task, read from the task's rewards
    fbs = [TaskFeedback(SimpleNamespace(planning=r), [], None) for r in (0.5, -0.25)]
    assert up.source("planning").over(fbs) == [0.5, -0.25]
    monkeypatch.setitem(methods.REWARD_SOURCES["planning"], "short",
                        methods.RewardSource(lambda feedback: [0.0], batch=True))
    with pytest.raises(ValueError, match="1 rewards for 2 tasks"):
        build_method(compose(["method.planning_reward=short"])).source("planning").over(fbs)


def _naive_average_linkage(d, threshold):
    """UPGMA straight from its definition: merge the pair of clusters of least mean pairwise distance."""
    clusters = [[i] for i in range(len(d))]
    while len(clusters) > 1:
        link, i, j = min((d[np.ix_(a, b)].mean(), i, j) for i, a in enumerate(clusters)
                         for j, b in enumerate(clusters) if i < j)
        if not link < threshold:
            break
        clusters[i] += clusters.pop(j)
    labels = np.empty(len(d), dtype=int)
    for label, members in enumerate(sorted(clusters, key=min)):
        labels[members] = label
    return labels


def test_lance_williams_updates_equal_the_definition_on_random_matrices():
    for seed in range(50):
        rng = np.random.default_rng(seed)
        m = rng.random((9, 9))
        m = (m + m.T) / 2
        np.fill_diagonal(m, 0)
        assert r_zero.average_linkage_labels(m).tolist() == _naive_average_linkage(m, 0.5).tolist(), seed
