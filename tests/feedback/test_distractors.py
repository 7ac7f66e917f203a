"""early_terminate's distractor pool (Appendix F.1, I.4): off-by-one,
rounded to tens, ±10 % and zero, never equal in value to the original answer."""
from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from unifiedplayers.feedback.perturbation import RULES, RuleParams, distractor_candidates, distractors_for
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step


def test_each_pool_member_by_hand_on_37():
    # 37: 37-1 = 36, 37+1 = 38, nearest ten 40, 37·1.1 = 40.7 -> 41, 37·0.9 = 33.3 -> 33, zero
    got = dict(distractor_candidates(Fraction(37), integral=True))
    assert got == {"minus_one": 36, "plus_one": 38, "round_tens": 40, "plus_10pct": 41, "minus_10pct": 33, "zero": 0}
    assert distractors_for("37") == ["36", "38", "40", "41", "33", "0"]


@pytest.mark.parametrize(
    "answer, pool",
    [
        # 9: 8, 10, tens 10 (dup), 9.9 -> 10 (dup), 8.1 -> 8 (dup), 0
        ("9", ["8", "10", "0"]),
        # 1: 0, 2, tens 0 (dup), 1.1 -> 1 (= answer), 0.9 -> 1 (= answer), 0 (dup)
        ("1", ["0", "2"]),
        # 0: -1, 1; tens, ±10 % and zero are all 0 = the answer
        ("0", ["-1", "1"]),
        # 25: tens rounds the half away from zero -> 30; 27.5 -> 28; 22.5 -> 23
        ("25", ["24", "26", "30", "28", "23", "0"]),
        ("-25", ["-26", "-24", "-30", "-28", "-23", "0"]),
        # 100: 99, 101, tens 100 (= answer), 110, 90, 0
        ("100", ["99", "101", "110", "90", "0"]),
        # -3: -4, -2, tens 0, -3.3 -> -3 and -2.7 -> -3 (= answer), 0 (dup)
        ("-3", ["-4", "-2", "0"]),
        # a decimal keeps its places: 1.5, 3.5, tens 0.0, 2.5·1.1 = 2.75, 2.5·0.9 = 2.25 (exact, not rounded)
        ("2.5", ["1.5", "3.5", "0.0", "2.75", "2.25"]),
        # 5/2 = 2.5: 3/2, 7/2, tens 0, 11/4, 9/4 (zero listed once)
        ("5/2", ["3/2", "7/2", "0", "11/4", "9/4"]),
        ("\\frac{5}{2}", ["\\frac{3}{2}", "\\frac{7}{2}", "0", "\\frac{11}{4}", "\\frac{9}{4}"]),
        # grouping and units are kept: 1,000 -> 999, 1,001, tens 1,000 (= answer), 1,100, 900, 0
        ("1,000", ["999", "1,001", "1,100", "900", "0"]),
        ("45^\\circ", ["44^\\circ", "46^\\circ", "50^\\circ", "41^\\circ", "0^\\circ"]),
        ("12\\%", ["11\\%", "13\\%", "10\\%", "0\\%"]),  # 13.2 -> 13 and 10.8 -> 11: duplicates
        ("$4$", ["3", "5", "0"]),  # tens 0, 4.4 -> 4 and 3.6 -> 4 (= answer)
    ],
)
def test_distractor_pool_by_hand(answer, pool):
    assert distractors_for(answer) == pool


@pytest.mark.parametrize("answer", ["4", "4.0", "4.00", "8/2", "\\frac{8}{2}", "$4$", "4\\%"])
def test_never_equal_in_value(answer):
    # "4.0" is 4: none of 3.0, 5.0, 0.0, 4.4, 3.6 is 4 (numerically, not just as text)
    def value(text: str) -> Fraction:  # an independent reading: a/b, \\frac{a}{b}, decimals, a unit dropped
        t = text.strip("$").replace("\\%", "")
        m = re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", t)
        return Fraction(int(m.group(1)), int(m.group(2))) if m else Fraction(t)

    pool = distractors_for(answer)
    assert len(pool) >= 2
    for d in pool:
        assert value(d) != 4


def test_decimal_answer_four_point_zero():
    # the style of "4.0" is kept, and no member equals 4 in value
    assert distractors_for("4.0") == ["3.0", "5.0", "0.0", "4.4", "3.6"]


@pytest.mark.parametrize(
    "answer, pool",
    [
        ("(7,3)", ["0"]),  # a tuple
        ("\\sqrt{2}", ["0"]),  # a closed form we do not evaluate
        ("x + 1", ["0"]),
        ("blue", ["0"]),
        (None, ["0"]),  # no answer at all
        ("none", ["1"]),  # it already means zero: 0 would restate it
        ("\\emptyset", ["1"]),
        ("9" * 5000, ["0"]),  # past int()'s digit limit: non-numeric
    ],
)
def test_non_numeric_answers(answer, pool):
    assert distractors_for(answer) == pool


def test_early_terminate_draws_every_member_and_never_the_answer():
    t = Trajectory("q", [reason_step("plan"), code_step("print(37)"), output_step("37"),
                         reason_step("So \\boxed{37}.")], "37")
    seen = set()
    for seed in range(200):
        v = RULES["early_terminate"](t, random.Random(seed), RuleParams())
        assert v.final_answer != "37" and v.final_answer in distractors_for("37")
        seen.add(v.final_answer)
    assert seen == {"36", "38", "40", "41", "33", "0"}  # drawn uniformly: all six appear in 200 draws
