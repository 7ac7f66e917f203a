"""Rewards (§3.2, Appendix B.1): every equation on a small Z worked out by hand, and the conf/reward presets."""
from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import numpy as np
import pytest

from unifiedplayers.feedback import rewards as R
from unifiedplayers.feedback import sympy_guard

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")

# A small task: M_q = 3 valid verifiers (of M = 4 generated; verifier 2 was invalid), K = 2, P = 2.
Z_ORIG = np.array([[1, 1], [1, 0], [0, 0]])
Z_ADV = np.array([
    [[0, 0], [1, 0]],
    [[1, 1], [1, 1]],
    [[0, 0], [0, 0]],
])
MASK = np.array([[True, False], [True, True]])
RED = np.array([0.2, 0.0, 0.5])
VALID = [0, 1, 3]


def test_eq4_execution_reward():
    # r_S(τ_0) = (1 + 1 + 0)/3 = 2/3;  r_S(τ_1) = (1 + 0 + 0)/3 = 1/3
    np.testing.assert_allclose(R.execution_rewards(Z_ORIG), [2 / 3, 1 / 3])


def test_eq4_without_valid_verifier_uses_the_configured_value():
    np.testing.assert_array_equal(R.execution_rewards(np.zeros((0, 3))), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(R.execution_rewards(np.zeros((0, 2)), no_valid_value=0.25), [0.25, 0.25])


def test_eq11_gold_pass_rate():
    # ρ_gold = [(1+1)/2, (1+0)/2, 0/2] = [1, 0.5, 0]
    np.testing.assert_allclose(R.gold_pass_rate(Z_ORIG), [1.0, 0.5, 0.0])


def test_eq11_adversarial_rejection_rate():
    # 1 − Z_adv summed over (k, j), over K·P = 4:
    #  v0: (1 + 1 + 0 + 1)/4 = 0.75;  v1: 0/4 = 0;  v2: 4/4 = 1
    np.testing.assert_allclose(R.adversarial_rejection_rate(Z_ADV), [0.75, 0.0, 1.0])


def test_eq11_adversarial_rejection_rate_with_mask():
    # Only (0,0), (1,0), (1,1) exist (3 variants):
    #  v0: Z = 0, 1, 0 -> rejections 1 + 0 + 1 = 2 -> 2/3;  v1: 0/3;  v2: 3/3
    np.testing.assert_allclose(R.adversarial_rejection_rate(Z_ADV, MASK), [2 / 3, 0.0, 1.0])
    # No variant at all: ρ_adv = 0.
    np.testing.assert_array_equal(R.adversarial_rejection_rate(Z_ADV, np.zeros((2, 2), bool)), [0, 0, 0])
    with pytest.raises(ValueError):
        R.adversarial_rejection_rate(Z_ADV, np.ones((2, 3), bool))


def test_eq5_evaluation_reward():
    # r_C = 0.4 ρ_gold + 0.5 ρ_adv − 0.1 ρ_red, with the terms worked out above
    #  v0: 0.4·1   + 0.5·0.75 − 0.1·0.2 = 0.4 + 0.375 − 0.02 = 0.755
    #  v1: 0.4·0.5 + 0.5·0    − 0.1·0   = 0.2
    #  v2: 0.4·0   + 0.5·1    − 0.1·0.5 = 0.5 − 0.05 = 0.45
    np.testing.assert_allclose(R.evaluation_rewards([1.0, 0.5, 0.0], [0.75, 0.0, 1.0], RED, 0.4, 0.5, 0.1),
                               [0.755, 0.2, 0.45])
    # with the mask, v0's ρ_adv is 2/3: 0.4 + 0.5·2/3 − 0.02 = 0.71333...
    np.testing.assert_allclose(R.evaluation_rewards([1.0], [2 / 3], [0.2], 0.4, 0.5, 0.1), [0.4 + 1 / 3 - 0.02])


def test_per_generated_puts_each_valid_verifier_at_its_index():
    # verifiers 0, 1, 3 of M = 4 are valid; verifier 2 gets the fill
    np.testing.assert_array_equal(R.per_generated([0.755, 0.2, 0.45], VALID, 4, -1.0), [0.755, 0.2, -1.0, 0.45])
    np.testing.assert_array_equal(R.per_generated([], [], 3, 0.5), [0.5, 0.5, 0.5])  # none valid
    with pytest.raises(ValueError, match="1 values for 2 valid verifiers"):
        R.per_generated([0.1], [0, 3], 4, 0.0)  # one value per valid verifier, never broadcast


def test_accept_all_and_reject_all():
    accept_all = (np.ones((1, 4)), np.ones((1, 4, 5)))
    reject_all = (np.zeros((1, 4)), np.zeros((1, 4, 5)))
    assert R.adversarial_rejection_rate(accept_all[1])[0] == 0.0
    assert R.gold_pass_rate(reject_all[0])[0] == 0.0
    # r_C(accept-all) = α = 0.4, r_C(reject-all) = β = 0.5 (no redundancy)
    for (z_orig, z_adv), r_c in ((accept_all, 0.4), (reject_all, 0.5)):
        terms = R.gold_pass_rate(z_orig), R.adversarial_rejection_rate(z_adv), [0.0]
        assert R.evaluation_rewards(*terms, 0.4, 0.5, 0.1)[0] == pytest.approx(r_c)


def test_eq3_eq12_verifier_writability():
    # V(q) = (M_q/M)·(1/M_q)·Σ ρ_adv = (1/M)·Σ ρ_adv = (0.75 + 0 + 1)/4 = 0.4375
    assert R.verifier_writability([0.75, 0.0, 1.0], 4) == pytest.approx(0.4375)
    # Eq. 3 form gives the same: m(q) = 3/4, mean ρ_adv = 1.75/3
    assert R.verifier_writability([0.75, 0.0, 1.0], 4) == pytest.approx(3 / 4 * (1.75 / 3))
    assert R.verifier_writability(np.zeros(0), 4) == 0.0  # no valid verifier
    assert R.verifier_writability([0.0, 0.0, 0.0], 4) == 0.0  # no valid verifier rejects a perturbation
    with pytest.raises(ValueError):
        R.verifier_writability([0.75, 0.0, 1.0], 2)


def test_eq2_planning_reward():
    # r_T = 1.0·0.25 + 1.0·0.4375 − 0.5·0.2 = 0.5875
    assert R.planning_reward(0.25, 0.4375, 0.2, 1.0, 1.0, 0.5) == pytest.approx(0.5875)


@pytest.mark.parametrize(
    "answers, missing_in_majority, u",
    [
        # clusters {9, 9, 9.0, 9} (4), {8}, {10}, {x}; None is no answer. p̂ = 4/8 -> U = 0.5
        (["9", "9", "9.0", "8", None, "10", "9", "x"], False, 0.5),
        # 5/2, 2.5 and \frac{5}{2} are one answer: p̂ = 3/4 -> U = 0.25
        (["5/2", "2.5", "\\frac{5}{2}", "3"], False, 0.25),
        # missing answers: p̂ = 1/4 (U = 0.25), or 2/4 when they form a cluster (U = 0.5)
        ([None, " ", "1", "2"], False, 0.25),
        ([None, " ", "1", "2"], True, 0.5),
        # all agree: p̂ = 1 -> U = 0;  none answered: p̂ = 0 -> U = 0
        (["7", "7", "7.0"], False, 0.0),
        ([None, None], False, 0.0),
        ([], False, 0.0),
    ],
)
def test_uncertainty(answers, missing_in_majority, u):
    assert R.uncertainty(answers, missing_in_majority) == pytest.approx(u)


def test_answer_clusters_use_math_equivalence():
    assert R.answer_clusters(["1/2", "0.5", "\\frac{1}{2}", "2", None, "(7,3)", "(7, 3)"]) == [[0, 1, 2], [3], [5, 6]]


def test_a_runaway_answer_is_cut_off_and_matching_goes_on(caplog):
    # sympy would evaluate 9^(9^(9^9)) for ever; after 2 s the guard process is killed and the answers
    # are grouped by text: {A, A}, {1}, {3} -> p̂ = 2/4 -> U = 0.5
    import time

    bomb = "9^{9^{9^{9}}}"
    t0 = time.perf_counter()
    assert R.uncertainty([bomb, "1", bomb, "3"], timeout_s=2.0) == 0.5
    assert time.perf_counter() - t0 < 15
    assert "grouping 4 answers by text" in caplog.text
    # the next call gets a fresh guard process and math equivalence again: {5/2, 2.5}, {3}, {4}
    assert R.answer_clusters(["5/2", "2.5", "3", "4"]) == [[0, 1], [2], [3]]


def test_the_guard_budget_is_cpu_time_not_wall_clock(monkeypatch):
    """The guard is stopped when its own CPU clock has advanced by the budget: a guard whose CPU clock stands still
    (it waits, as a starved process would) is not cut off by the wall clock before ``wall_factor`` budgets."""
    import subprocess
    import sys
    import time

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        first = sympy_guard.process_cpu_seconds(spin.pid)
        time.sleep(0.3)
        assert 0.05 < first < sympy_guard.process_cpu_seconds(spin.pid) < 10
    finally:
        spin.kill()
        spin.wait()
    assert sympy_guard.process_cpu_seconds(spin.pid) == float("inf")  # gone: a wait on it ends

    frozen = {"cpu": 0.0}
    monkeypatch.setattr(sympy_guard, "process_cpu_seconds", lambda pid: frozen["cpu"])
    guard = sympy_guard._ClusterGuard()
    try:
        guard._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6); print('late')"],
                                       stdout=subprocess.PIPE)
        # 0.2 s of CPU budget that the "starved" process never spends: it answers after 0.6 s of wall clock
        assert guard._read_line(time.monotonic() + 5.0, cpu_limit=0.2) == b"late\n"
        guard._proc.wait()
        guard._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], stdout=subprocess.PIPE)
        frozen["cpu"] = 0.25  # its CPU clock passed the budget: stopped at once
        t0 = time.monotonic()
        assert guard._read_line(time.monotonic() + 5.0, cpu_limit=0.2) is None and time.monotonic() - t0 < 1
    finally:
        guard._proc.kill()
        guard._proc.wait()


def test_uncertainty_works_in_threads():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        assert list(ex.map(R.uncertainty, [["5/2", "2.5", "3", "4"]] * 2)) == [0.5, 0.5]


def test_repetition_penalty_bleu():
    q = "a b c d e"
    assert R.repetition_penalty(q, []) == 0.0
    assert R.repetition_penalty(q, ["a b c d e"]) == pytest.approx(1.0)
    # hyp "a b c d e" vs ref "a b c d e f": all n-gram precisions 1 (5/5, 4/4, 3/3, 2/2), brevity
    # penalty exp(1 − 6/5) = exp(−0.2) = 0.81873 -> BLEU/100 = 0.81873
    assert R.repetition_penalty(q, ["a b c d e f"]) == pytest.approx(math.exp(-0.2), abs=1e-4)
    assert R.repetition_penalty(q, ["v w x y z", "a b c d e f"]) == pytest.approx(math.exp(-0.2), abs=1e-4)
    # cluster share: 2 of 4 history questions reach BLEU/100 >= 0.5
    hist = ["a b c d e", "a b c d e f", "v w x y z", "p q r s t"]
    assert R.repetition_penalty(q, hist, mode="cluster_share", threshold=0.5) == 0.5
    assert 0.0 <= R.repetition_penalty("How many divisors does 196 have?", ["Find the gcd of 6 and 8."]) < 0.2
    with pytest.raises(ValueError):
        R.repetition_penalty(q, hist, mode="bleurt")


def test_question_history_keeps_the_last_n():
    h = R.QuestionHistory(2, ["q1"])
    h.extend(["q2", "q3"])
    assert list(h) == ["q2", "q3"] and len(h) == 2
    assert R.repetition_penalty("q1", h) < 1.0 and R.repetition_penalty("q3", h) == pytest.approx(1.0)


# ---- redundancy ------------------------------------------------------------------------------------

V_A = '''
def check(trajectory):
    outs = [s.result for s in trajectory.steps if s.type == "output"]
    if not outs or str(outs[-1]).strip() != str(trajectory.final_answer).strip():
        return False, "code output and final answer mismatch"  # diagnostic
    return True, "passed"
'''
V_A_RENAMED = '''
def check(t):
    results = [step.result for step in t.steps if step.type == "output"]
    if not results or str(results[-1]).strip() != str(t.final_answer).strip():
        return False, "mismatch"
    return True, "ok"
'''
V_B = '''
def check(trajectory):
    expected = sum(1 for d in range(1, 197) if 196 % d == 0)
    if int(trajectory.final_answer) != expected:
        return False, f"wrong count: expected {expected}"
    return True, "passed"
'''


@pytest.mark.parametrize("method", ["sequence", "jaccard"])
def test_redundancy_ignores_names_strings_and_comments(method):
    red = R.redundancy([V_A, V_A_RENAMED, V_B], method)
    assert red[0] == red[1] == 1.0  # a renamed copy is the same verifier
    assert 0.0 < red[2] < 0.8
    assert R.code_similarity(V_A, V_B, method) == R.code_similarity(V_B, V_A, method) == red[2]


def test_similarity_by_hand():
    # tokens: [v0, '=', '1', NEWLINE] vs [v0, '=', '2', NEWLINE]: 3 matches -> 2·3/8 = 0.75
    assert R.code_similarity("x = 1\n", "y = 2\n", "sequence") == pytest.approx(0.75)
    # trigrams {(v0,=,1), (=,1,NL)} vs {(v0,=,2), (=,2,NL)}: no overlap -> 0
    assert R.code_similarity("x = 1\n", "y = 2\n", "jaccard") == 0.0
    # attribute names are kept: .result vs .text differ in 1 of 6 tokens -> 2·5/12
    assert R.code_similarity("a = b.result\n", "a = b.text\n", "sequence") == pytest.approx(10 / 12)


def test_redundancy_edge_cases():
    assert R.redundancy([]).shape == (0,)
    np.testing.assert_array_equal(R.redundancy([V_A]), [0.0])  # nothing to repeat
    np.testing.assert_array_equal(R.redundancy([V_A, V_A]), [1.0, 1.0])
    with pytest.raises(ValueError):
        R.redundancy([V_A, V_B], "cosine")


# ---- conf/reward presets and the choices the paper leaves open (§3.2, Appendix B.1) ---------------------------------------------


@functools.lru_cache(maxsize=None)
def _compose_reward(preset):
    from hydra import compose, initialize_config_dir

    from unifiedplayers.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("config", overrides=[f"reward={preset}"]).reward


def compose_reward(preset):
    return copy.deepcopy(_compose_reward(preset))


TABLE_17 = {
    "default": (0.4, 0.5, 0.1),
    "gold_heavy": (0.6, 0.3, 0.1),
    "adv_heavy": (0.2, 0.7, 0.1),
    "high_diversity": (0.4, 0.5, 0.3),
    "no_diversity": (0.4, 0.5, 0.0),
}


def task(cfg, answers=("9", "9", "8", None), question="q", history=()):
    return R.task_rewards(Z_ORIG, Z_ADV, VALID, 4, [V_A, V_A_RENAMED, V_B], list(answers), question,
                          list(history), cfg)


@pytest.mark.parametrize("preset", sorted(TABLE_17))
def test_table17_presets(preset):
    cfg = compose_reward(preset)
    alpha, beta, gamma = TABLE_17[preset]
    assert (cfg.alpha, cfg.beta, cfg.gamma) == (alpha, beta, gamma) and cfg.name == preset
    assert (cfg.w_unc, cfg.w_ver, cfg.w_rep) == (1.0, 1.0, 0.5)
    out = task(cfg)
    # ρ_gold = [1, .5, 0], ρ_adv = [.75, 0, 1], ρ_red = [1, 1, red_b] (V_A and its renamed copy)
    red_b = R.code_similarity(V_B, V_A)
    expected = [alpha * 1 + beta * 0.75 - gamma, alpha * 0.5 - gamma, beta * 1 - gamma * red_b]
    np.testing.assert_allclose(out.evaluation[VALID], expected)
    assert out.evaluation[2] == cfg.invalid_verifier_reward == -1.0


def test_open_choices_of_the_default_preset():
    cfg = compose_reward("default")
    out = task(cfg)
    np.testing.assert_allclose(out.execution, [2 / 3, 1 / 3])
    # answers 9, 9, 8, (missing): p̂ = 2/4 -> U = 0.5; V = 0.4375; R = 0 (empty history)
    assert out.uncertainty == 0.5 and out.writability == pytest.approx(0.4375) and out.repetition == 0.0
    assert out.planning == pytest.approx(1.0 * 0.5 + 1.0 * 0.4375 - 0.5 * 0.0)
    # r_S when M_q = 0: the configured value for every trajectory (zero advantage in the group)
    none_valid = R.task_rewards(np.zeros((0, 2)), np.zeros((0, 2, 2)), [], 4, [], ["1", "2"], "q", [], cfg)
    np.testing.assert_array_equal(none_valid.execution, [cfg.execution_reward_no_valid_verifier] * 2)
    np.testing.assert_array_equal(none_valid.evaluation, [-1.0] * 4)
    assert none_valid.writability == 0.0
    # an invalid verifier and a malformed task rank below anything a valid one can get
    assert cfg.invalid_verifier_reward < -max(g for _, _, g in TABLE_17.values())
    assert cfg.malformed_task_reward < -cfg.w_rep
    # a missing answer never forms the majority: answers (None, None, 1, 2): p̂ = 1/4 -> U = 0.25
    assert cfg.missing_answer_in_majority is False
    assert task(cfg, answers=(None, None, "1", "2")).uncertainty == 0.25
    assert cfg.repetition_mode == "max_bleu" and cfg.redundancy_similarity == "sequence"
    # repetition: the same question in the history costs w_rep·1
    assert task(cfg, question="a b c d e", history=["a b c d e"]).planning == pytest.approx(0.5 + 0.4375 - 0.5)


def test_each_term_is_computed_once(monkeypatch):
    calls = {"adv": 0, "gold": 0, "red": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name, fn in (("adv", "adversarial_rejection_rate"), ("gold", "gold_pass_rate"), ("red", "redundancy")):
        monkeypatch.setattr(R, fn, counted(name, getattr(R, fn)))
    out = task(compose_reward("default"))
    assert calls == {"adv": 1, "gold": 1, "red": 1}
    # and r_C and V(q) read those very terms
    np.testing.assert_allclose(out.adv, [0.75, 0.0, 1.0])
    assert out.writability == pytest.approx(out.adv.sum() / 4)


def test_without_verifiability_term():
    cfg = compose_reward("default")
    cfg.use_verifiability = False
    out = task(cfg)
    assert out.writability == 0.0 and out.planning == pytest.approx(0.5)
