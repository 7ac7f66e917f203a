"""The worked extension examples/custom_rule/ (a perturbation rule outside the package: one Python file, one
YAML), run from a copy outside the repository, as a researcher would."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from unifiedplayers.feedback.perturbation import ALL_RULES, RULES, PerturbationEngine, RuleParams, rule_rng
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step

pytestmark = pytest.mark.cpu

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"  # experiment=tiny's task


@pytest.fixture()
def copy(example_copy):
    yield example_copy("custom_rule", "given_quantity")
    RULES.pop("given_quantity", None)  # the registry is the process's: leave the five built-ins only


def test_the_rule_answers_with_a_quantity_the_question_gives(copy):
    from given_quantity import given_quantities

    rule = RULES["given_quantity"]  # registered when imported
    assert rule.scope == "global" and rule.abbrev == "given" and not rule.executes
    t = Trajectory(QUESTION, [reason_step("He has 3 + 4 apples."), code_step("print(3 + 4)"), output_step("7"),
                              reason_step("So the answer is \\boxed{7}.")], "7")
    answers = set()
    for seed in range(20):
        v = rule(t, random.Random(seed), RuleParams())
        # every step kept; only the box of the last reasoning step changes, to 3 or 4
        assert v.steps[:3] == t.steps[:3] and v.steps[3].text == f"So the answer is \\boxed{{{v.final_answer}}}."
        answers.add(v.final_answer)
    assert answers == {"3", "4"} and t.final_answer == "7"  # both drawn; the original untouched
    # no answer stated: the sentence joins the last reasoning step, as early_terminate's does
    v = rule(Trajectory(QUESTION, [reason_step("Add them.")], None), random.Random(0), RuleParams())
    assert v.steps[0].text in ("Add them.\n\nSo the answer is \\boxed{3}.", "Add them.\n\nSo the answer is \\boxed{4}.")
    # a number equal in value to the answer is no distractor; nothing left: the rule cannot apply
    assert given_quantities("Is 2.0 + 0 equal to 2, out of 1,000?", "2") == ["0", "1,000"]
    assert rule(Trajectory("What is 5 + 0?", [], "5"), random.Random(0), RuleParams()) == \
        Trajectory("What is 5 + 0?", [reason_step("So the answer is \\boxed{0}.")], "0")
    assert rule(Trajectory("What is five?", [], "5"), random.Random(0), RuleParams()) is None
    # the engine draws as the rule does (seeded by the rule's name and the trajectory)
    assert PerturbationEngine(["given_quantity"], seed=3).perturb(t) == [rule(t, rule_rng(3, "given_quantity", t),
                                                                               RuleParams())]


def test_the_yaml_lists_the_rule_beside_the_five_and_imports_its_module(copy):
    from unifiedplayers.config import compose

    cfg = compose([f"hydra.searchpath=[file://{copy}/conf]", "experiment=tiny", "perturbation=with_given_quantity"])
    assert list(cfg.perturbation.rules) == [*ALL_RULES, "given_quantity"]
    assert "given_quantity" not in RULES  # not imported yet: from_config imports perturbation.modules
    engine = PerturbationEngine.from_config(cfg.perturbation, sandbox=object())
    assert engine.num_rules == 6 and "given_quantity" in RULES and tuple(ALL_RULES) == tuple(RULES.names())[:5]


def test_a_rule_that_is_not_registered_fails_naming_the_known_ones_and_perturbation_modules():
    with pytest.raises(ValueError, match=r"unknown perturbation rules \['given_quantity'\].*early_terminate.*modules"):
        PerturbationEngine(["given_quantity"])


def test_the_example_trains_from_a_copy_outside_the_repository(copy, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "unifiedplayers.train", "experiment=tiny", "perturbation=with_given_quantity",
           f"hydra.searchpath=[file://{copy}/conf]", f"run_dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    played = [r for r in records if r["trajectories"]]
    assert played
    for r in played:
        assert r["rules"] == [*ALL_RULES, "given_quantity"]
        for traj, variants, mask in zip(r["trajectories"], r["variants"], r["adv_mask"]):
            # the sixth variant of every trajectory: its steps, answered with 3 or 4 (the random model states none)
            variant = Trajectory.from_dict(variants[5])
            assert mask[5] and variant.final_answer in ("3", "4")
            assert variant == stated(traj, variant.final_answer)
    assert "t0:given" in (run_dir / "summary.md").read_text()  # its column in the verdict table


def stated(traj: dict, answer: str) -> Trajectory:
    """The variant the rule gives ``traj`` when it draws ``answer`` (a copy of the original, the answer stated)."""
    from unifiedplayers.feedback.trajectory import state_answer

    out = Trajectory.from_dict(traj)
    state_answer(out, answer)
    return out
