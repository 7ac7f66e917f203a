"""The priced table of degenerate strategies (eval/analysis/strategies.py), computed once through the real feedback
(parser, sandbox, the five perturbation rules, Z, Eq. 2-5), against numbers worked out by hand; and
docs/method.md holds exactly what ``python -m eval.analysis.strategies`` prints.

Task A (answer 69), K = 5: τ0 correct with a tool, τ1 wrong (99) with a tool, τ2 right answer boxed without a
tool, τ3 the question copied (no answer), τ4 empty (no answer). Variants that apply (15 of K·P = 25):
τ0, τ1 all five; τ2 step_drop (no steps left, answer 69 kept) and early_terminate; τ3 step_drop (no steps, no
answer) and early_terminate (answer 0); τ4 early_terminate (answer 0). Task B, K = 4: τ1, a wrong 84 with a tool
(all five), τ3, τ4: 13 of 20. Answered: 3 originals and 14 variants on A (all but τ3's step_drop), 2 and 12 on B.
The companion of every Evaluation pool (M = 2) accepts an original whose last output is its answer (τ0, τ1, the
84) and, of their variants, step_drop, step_swap, tool_substitute (answer and outputs unchanged): on A
ρ_gold = 2/5, ρ_adv = (2 + 2 + 2 + 2 + 1)/15 = 9/15; on B ρ_gold = 2/4, ρ_adv = (2 + 2 + 2 + 1)/13 = 7/13.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from eval.analysis import strategies as S

DOC = Path(__file__).resolve().parents[2] / "docs" / "method.md"
A_COMPANION_ADV, B_COMPANION_ADV = 9 / 15, 7 / 13


@pytest.fixture(scope="module")
def sandbox():
    """One warm sandbox with the table's limits (a 0.5 s CPU limit, so the sleeping check costs 1.5 s a call)."""
    from unifiedplayers.sandbox import Sandbox

    with Sandbox(S.sandbox_config()) as sb:
        yield sb


@pytest.fixture(scope="module")
def table(sandbox):
    return S.strategy_table(sandbox)  # the default reward preset, composed from conf/


def _eq5(row, gold, adv):
    """Eq. 5 at (α, β, γ) = (0.4, 0.5, 0.1) with the row's own ρ_red (its similarity to the companion)."""
    return 0.4 * gold + 0.5 * adv - 0.1 * row["red"]


def test_the_reward_is_the_default_preset(table):
    w = table["reward"]
    assert (w["name"], w["alpha"], w["beta"], w["gamma"]) == ("default", 0.4, 0.5, 0.1)
    assert (w["w_unc"], w["w_ver"], w["w_rep"]) == (1.0, 1.0, 0.5) and not w["variant_error_credit"]
    assert table["K"] == {"A": 5, "B": 4, "all_solve": 4, "none_solve": 4}
    assert table["variants"] == {"A": 15, "B": 13, "P": 5}


def test_accept_all_gets_no_adversarial_reward_and_reject_all_no_original_pass_reward(table):
    # The paper (§3.2): "an accept-all verifier receives no adversarial reward, a reject-all verifier no
    # original-pass reward".
    for task in ("A", "B"):
        acc, rej = table["evaluation"][task]["accept_all"], table["evaluation"][task]["reject_all"]
        assert (acc["kind"], acc["gold"], acc["adv"]) == ("accepts_all", 1.0, 0.0)
        assert (rej["kind"], rej["gold"], rej["adv"]) == ("rejects_all", 0.0, 1.0)
        # r_C = 0.4·1 − 0.1·ρ_red and 0.5 − 0.1·ρ_red
        assert acc["reward"] == pytest.approx(_eq5(acc, 1, 0)) and rej["reward"] == pytest.approx(_eq5(rej, 0, 1))
    # V(q) of the pool (M = 2): (0 + 9/15)/2 with accept-all, (1 + 9/15)/2 with reject-all
    a = table["evaluation"]["A"]
    assert a["accept_all"]["writability"] == pytest.approx(A_COMPANION_ADV / 2)
    assert a["reject_all"]["writability"] == pytest.approx((1 + A_COMPANION_ADV) / 2)


@pytest.mark.parametrize("task, k, variants", [("A", 5, 15), ("B", 4, 13)])
def test_no_failure_strategy_beats_the_verifier_that_completes(table, task, k, variants):
    rows = table["evaluation"][task]
    rej = rows["reject_all"]
    companion_adv = {"A": A_COMPANION_ADV, "B": B_COMPANION_ADV}[task]
    # raises / returns None on every check: errors on every original -> invalid, -1, no row in Z, nothing in V(q)
    for key in ("raises", "returns_none"):
        r = rows[key]
        assert (r["kind"], r["valid"], r["reward"], r["errors"]) == ("invalid", False, -1.0, (k, variants))
        assert r["writability"] == pytest.approx(companion_adv / 2)  # V(q) = (1/M)·ρ_adv(companion)
    # the prefix-crasher and the prefix-sleeper reject the unanswered originals cleanly (valid), error on every
    # answered check: ρ_gold 0, ρ_adv = (clean rejections: τ3's step_drop only) / variants = 1/15 on A, 1/13 on B
    answered = {"A": (3, 14), "B": (2, 12)}[task]
    for key in ("prefix_raises", "prefix_none", "prefix_timeout"):
        r = rows[key]
        assert (r["kind"], r["valid"], r["errors"]) == ("crashes_answered", True, answered)
        assert (r["gold"], r["adv"]) == (0.0, pytest.approx(1 / variants))
        assert r["reward"] == pytest.approx(_eq5(r, 0, 1 / variants))  # at most 0.5/13 < 0.04 for any ρ_red
        # the same verifier made to complete (reject where it errors) is the clean reject-all, 0.5 − 0.1·ρ_red:
        # more than 0.4 above
        assert r["reward"] < rej["reward"] - 0.4
        assert r["writability"] == pytest.approx((1 / variants + companion_adv) / 2)
        assert r["writability"] < rej["writability"]
    valid = [r["reward"] for r in rows.values() if r["valid"]]
    assert max(rows["raises"]["reward"], rows["returns_none"]["reward"]) < min(valid)


def test_errors_credited_pays_the_prefix_crasher_like_a_reject_all(sandbox, table):
    # The contrast: reward=errors_credited counts an error on a variant as a rejection, the exploit of checks that crash on answered trajectories.
    credited = S.compose_config("errors_credited").reward
    assert credited.variant_error_credit
    got = S.strategy_table(sandbox, credited, evaluation=["prefix_raises", "prefix_none", "reject_all",
                                                          "answer_checker"])
    for task, companion_adv in (("A", A_COMPANION_ADV), ("B", B_COMPANION_ADV)):
        rows = got["evaluation"][task]
        for key in ("prefix_raises", "prefix_none"):
            r, default = rows[key], table["evaluation"][task][key]
            assert (r["errors"], r["red"]) == (default["errors"], default["red"])  # the same checks ran
            # ρ_adv: 14 errors + 1 rejection of 15 (A), 12 + 1 of 13 (B) -> 1, as the reject-all
            assert (r["gold"], r["adv"]) == (0.0, 1.0) and default["adv"] < 0.1
            assert r["reward"] == pytest.approx(_eq5(r, 0, 1)) and r["reward"] > default["reward"] + 0.4
            assert r["writability"] == pytest.approx((1 + companion_adv) / 2) == rows["reject_all"]["writability"]
    # ... and on A it out-scores the perfect answer checker: 0.5 − 0.1·0.45 > 0.4·2/5 + 0.5·10/15 − 0.1·0.47
    a = got["evaluation"]["A"]
    assert a["prefix_raises"]["reward"] > a["answer_checker"]["reward"]
    assert a["answer_checker"]["reward"] == pytest.approx(table["evaluation"]["A"]["answer_checker"]["reward"])


def test_ties_and_orders_eq5_leaves(table):
    a, b = table["evaluation"]["A"], table["evaluation"]["B"]
    # B, no right original: the perfect answer checker rejects every original and every variant (no
    # early_terminate distractor of 99 or 84 is 69): the verdicts of a clean reject-all. Eq. 5 ties them; r_C
    # differs only by γ·ρ_red (their similarities to the companion).
    ans, rej = b["answer_checker"], b["reject_all"]
    assert (ans["kind"], ans["gold"], ans["adv"]) == ("rejects_all", 0.0, 1.0)
    assert ans["reward"] - rej["reward"] == pytest.approx(-0.1 * (ans["red"] - rej["red"]))
    # A, two right originals: the answer checker accepts τ0, τ2 (ρ_gold 2/5) and 5 of 15 variants (τ0's four
    # that keep the answer, τ2's step_drop): 0.4·2/5 + 0.5·10/15 = 0.4933 < 0.5, the reject-all's score before
    # ρ_red. Eq. 5 pays rejecting everything over a perfect answer check unless originals are accepted at least
    # β/α = 1.25 times as often as variants (here 0.4 against 1/3, 1.2 times).
    ans, rej = a["answer_checker"], a["reject_all"]
    assert (ans["kind"], ans["gold"], ans["adv"]) == ("discriminating", 0.4, pytest.approx(10 / 15))
    assert ans["reward"] == pytest.approx(_eq5(ans, 0.4, 10 / 15))
    assert 0.4 * ans["gold"] + 0.5 * ans["adv"] < 0.4 * rej["gold"] + 0.5 * rej["adv"]
    # the tamper detector accepts the well-formed tool trajectories, right or wrong (τ0, τ1; B: the 99 and the
    # 84) and rejects every variant: the best r_C on both tasks (A: 0.4·2/5 + 0.5, B: 0.4·2/4 + 0.5)
    for rows, gold in ((a, 0.4), (b, 0.5)):
        t = rows["tamper_detector"]
        assert (t["gold"], t["adv"]) == (gold, 1.0) and t["reward"] == pytest.approx(_eq5(t, gold, 1))
        assert t["reward"] == max(r["reward"] for r in rows.values())
    # the near-copy has the companion's verdicts (A: 2/5, 9/15) and pays γ·ρ_red for the copy, the largest ρ_red
    n = a["near_copy"]
    assert (n["gold"], n["adv"]) == (0.4, pytest.approx(A_COMPANION_ADV)) and n["red"] > 0.9
    assert n["reward"] == pytest.approx(_eq5(n, 0.4, A_COMPANION_ADV))
    assert n["red"] == max(r["red"] for r in a.values() if r["valid"])


def test_planning_strategies(table):
    p = table["planning"]
    # malformed outputs never reach Eq. 2: reward.malformed_task_reward
    assert (p["malformed"]["parsed"], p["malformed"]["reward"]) == ("question shorter than 20 characters", -1.0)
    assert (p["no_boxed"]["parsed"], p["no_boxed"]["reward"]) == ("no \\boxed{} answer", -1.0)
    for key in ("honest", "all_solve", "none_solve", "repeat"):
        r = p[key]
        assert r["parsed"] == "valid" and r["reward"] == pytest.approx(r["U"] + r["V"] - 0.5 * r["R"])
    # U: task A's answers 69, 99, 69, –, –: p̂ = 2/5 -> 0.4; all-solve p̂ = 4/4 and none-solve p̂ = 0/4 -> 0
    assert p["honest"]["U"] == pytest.approx(0.4)
    assert p["all_solve"]["U"] == 0.0 and p["none_solve"]["U"] == 0.0
    # V(q) = (1/3)·Σ ρ_adv of answer checker, tamper detector, companion. A: (10/15 + 1 + 9/15)/3 = 34/45.
    # All-solve (20 variants, all answered 270): answer checker rejects the 4 early_terminate ones, the companion
    # those and the 4 arg_mutation ones: (4/20 + 1 + 8/20)/3 = 8/15. None-solve: every variant keeps "no answer"
    # or gets the injected 0, and all three reject it: V = 1, the most a task can earn from V.
    assert p["honest"]["V"] == pytest.approx(34 / 45)
    assert p["all_solve"]["V"] == pytest.approx(8 / 15)
    assert p["none_solve"]["V"] == pytest.approx(1.0)
    # the repeat: task A with its question in the history, R = 1 (BLEU 100); same U and V: it pays w_rep·(1 − R(A))
    rep, honest = p["repeat"], p["honest"]
    assert rep["R"] == pytest.approx(1.0) and 0 < honest["R"] < 0.2
    assert (rep["U"], rep["V"]) == (honest["U"], honest["V"])
    assert honest["reward"] - rep["reward"] == pytest.approx(0.5 * (1 - honest["R"]))
    assert honest["reward"] > p["none_solve"]["reward"] > p["all_solve"]["reward"] > p["malformed"]["reward"]


def test_execution_strategies(table):
    e = table["execution"]
    # Z_orig columns (answer checker, tamper detector, companion): the correct tool trajectory passes all three;
    # the wrong tool one passes the two form checks; the right answer without a tool only the answer check; the
    # copied question and the empty answer none. r_S = mean over the M = 3.
    assert {k: (r["accepted"], r["reward"]) for k, r in e.items()} == {
        "correct_tool": ([1, 1, 1], 1.0), "wrong_tool": ([0, 1, 1], pytest.approx(2 / 3)),
        "boxed_no_tool": ([1, 0, 0], pytest.approx(1 / 3)), "question_copied": ([0, 0, 0], 0.0),
        "empty": ([0, 0, 0], 0.0)}
    assert (e["correct_tool"]["tool_calls"], e["boxed_no_tool"]["tool_calls"]) == (1, 0)
    assert all(e["correct_tool"]["reward"] > r["reward"] for k, r in e.items() if k != "correct_tool")


def test_printed_table_is_the_formatter_output_and_is_in_the_docs(table, monkeypatch, capsys):
    md = S.to_markdown(table)
    seen = []

    def priced(sandbox=None, reward_cfg=None, evaluation=None):
        seen.append(reward_cfg.name)
        return table

    monkeypatch.setattr(S, "strategy_table", priced)
    assert S.main([]) == md and capsys.readouterr().out == md
    S.main(["--reward", "errors_credited"])
    assert seen == ["default", "errors_credited"]
    # docs/method.md holds the printed table verbatim between its markers, so the doc cannot drift from the reward
    text = DOC.read_text()
    m = re.search(r"<!-- strategies:begin -->\n(.*?)<!-- strategies:end -->", text, re.DOTALL)
    assert m is not None, "docs/method.md lacks the strategies markers"
    assert m.group(1).strip("\n") + "\n" == md, "docs/method.md is stale: paste `python -m eval.analysis.strategies`"
