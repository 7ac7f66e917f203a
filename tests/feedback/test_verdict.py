"""The verdict matrix: shapes, values worked out by hand, one parallel sandbox batch per task."""
from __future__ import annotations

import numpy as np
import pytest
from tests.feedback.paper_examples import TRAJ1, VERIFIER_1_1, VERIFIER_1_2, fenced

from unifiedplayers.feedback import rewards
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step
from unifiedplayers.feedback.verdict import verdict_matrix

ACCEPT_ALL = "def check(trajectory):\n    return True\n"
REJECT_ALL = "def check(trajectory):\n    return (False, 0)\n"


class CountingSandbox:
    """Wraps the real sandbox and records each batch it is given."""

    def __init__(self, sb):
        self.sb, self.batches = sb, []

    def call_many(self, items):
        items = list(items)
        self.batches.append(len(items))
        return self.sb.call_many(items)


# τ_0 = Trajectory 1 (right: output 9, answer 9); τ_1 = a wrong one whose output and answer are both 8.
WRONG = Trajectory(TRAJ1.question, [reason_step("Count them."), code_step("print(8)"), output_step("8")], "8")


def test_verdict_matrix_by_hand(sandbox):
    engine = PerturbationEngine(["step_drop", "early_terminate", "tool_substitute"], seed=0)
    originals = [TRAJ1, WRONG]
    variants = engine.perturb_many(originals)
    outputs = [
        fenced(VERIFIER_1_1),  # 0: answer == 9
        "```python\ndef check(t)\n    return True\n```",  # 1: invalid (syntax), no row
        fenced(VERIFIER_1_2),  # 2: last output == answer
        fenced(ACCEPT_ALL),  # 3
    ]
    box = CountingSandbox(sandbox)
    vm = verdict_matrix(outputs, originals, variants, box)
    assert vm.valid == [0, 2, 3] and vm.num_generated == 4
    assert not vm.compiled[1].valid and "does not compile" in vm.compiled[1].reason
    assert vm.z_orig.shape == (3, 2) and vm.z_adv.shape == (3, 2, 3) and vm.adv_mask.shape == (2, 3)
    assert vm.adv_mask.all()
    # Z_orig by hand: 1.1 accepts τ_0 only; 1.2 accepts both (output == answer in each); accept-all both.
    np.testing.assert_array_equal(vm.z_orig, [[1, 0], [1, 1], [1, 1]])
    # Z_adv by hand, columns (step_drop, early_terminate, tool_substitute):
    #  1.1: step_drop keeps the answer (τ_0: 9 -> accept; τ_1: 8 -> reject); early_terminate's answer is
    #       never 9 for τ_0; for τ_1 it is drawn from {7, 9, 0} (checked below); tool_substitute keeps the answer.
    #  1.2: step_drop and tool_substitute keep output == answer -> accept; early_terminate breaks it
    #       (fabricated answer != last output, or no output left) -> reject.
    #  accept-all: all 1.
    early_1 = variants[1][1].final_answer
    np.testing.assert_array_equal(vm.z_adv[0], [[1, 0, 1], [0, int(early_1 == "9"), 0]])
    np.testing.assert_array_equal(vm.z_adv[1], [[1, 0, 1], [1, 0, 1]])
    np.testing.assert_array_equal(vm.z_adv[2], np.ones((2, 3)))
    # One batch with all M_q·K·(1+P) = 3·2·4 = 24 checks.
    assert box.batches == [24] and len(vm.checks) == 24
    assert vm.z.shape == (3, 2 * 4)
    np.testing.assert_array_equal(vm.z[:, 2:], vm.z_adv.reshape(3, 6))
    assert vm.errors == []  # every check returned a verdict
    rejected = [c for c in vm.checks if c.verifier == 0 and c.trajectory == 1 and c.variant is None]
    assert len(rejected) == 1 and "wrong count: expected 9" in rejected[0].outcome.reason


def test_degenerate_verifiers_get_the_papers_zero_terms(sandbox):
    engine = PerturbationEngine(seed=1, sandbox=sandbox)
    originals = [TRAJ1, WRONG]
    variants = engine.perturb_many(originals)
    same = fenced(VERIFIER_1_1)
    vm = verdict_matrix([fenced(ACCEPT_ALL), fenced(REJECT_ALL), same, same], originals, variants, sandbox)
    assert vm.z_orig.shape == (4, 2) and vm.z_adv.shape == (4, 2, 5)
    rho_adv = rewards.adversarial_rejection_rate(vm.z_adv, vm.adv_mask)
    rho_gold = rewards.gold_pass_rate(vm.z_orig)
    rho_red = rewards.redundancy(vm.valid_sources)
    assert rho_adv[0] == 0.0 and rho_gold[0] == 1.0  # accept-all: no adversarial reward
    assert rho_gold[1] == 0.0 and rho_adv[1] == 1.0  # reject-all: no original-pass reward
    assert rho_red[2] == rho_red[3] == 1.0  # two identical verifiers
    assert rho_gold[2] == 0.5  # 1.1 accepts τ_0, rejects τ_1


def test_masked_variants_are_never_run(sandbox):
    no_reason = Trajectory("What is 2+3?", [code_step("print(2+3)"), output_step("5")], "5")
    engine = PerturbationEngine(["step_drop", "tool_substitute"], seed=0)
    variants = engine.perturb_many([no_reason])
    assert variants[0][0] is None  # step_drop cannot apply: no reason step
    box = CountingSandbox(sandbox)
    vm = verdict_matrix([fenced(REJECT_ALL)], [no_reason], variants, box)
    np.testing.assert_array_equal(vm.adv_mask, [[False, True]])
    assert box.batches == [2]  # the original and the one existing variant
    # reject-all rejects the one existing variant: ρ_adv = 1/1, not 1/2 and not 2/2 of a padded entry
    assert rewards.adversarial_rejection_rate(vm.z_adv, vm.adv_mask)[0] == 1.0


def test_no_valid_verifier_runs_nothing(sandbox):
    box = CountingSandbox(sandbox)
    vm = verdict_matrix(["no code here", fenced("def verify(t):\n    return True")], [TRAJ1], [[None]], box)
    assert vm.valid == [] and vm.z_orig.shape == (0, 1) and vm.z_adv.shape == (0, 1, 1)
    assert box.batches == [] and vm.num_generated == 2
    rho_adv = rewards.adversarial_rejection_rate(vm.z_adv, vm.adv_mask)
    assert rho_adv.shape == (0,) and rewards.verifier_writability(rho_adv, vm.num_generated) == 0.0
    np.testing.assert_array_equal(rewards.execution_rewards(vm.z_orig), [0.0])


def test_without_perturbations(sandbox):
    vm = verdict_matrix([fenced(VERIFIER_1_1)], [TRAJ1, WRONG], None, sandbox)
    assert vm.z_adv.shape == (1, 2, 0) and vm.adv_mask.shape == (2, 0)
    np.testing.assert_array_equal(vm.z_orig, [[1, 0]])
    assert rewards.adversarial_rejection_rate(vm.z_adv, vm.adv_mask)[0] == 0.0


def test_bad_verifiers_are_recorded_and_the_batch_goes_on(sandbox, tmp_path):
    path = tmp_path / "answer.txt"
    path.write_text("9")
    outputs = [
        fenced("def check(t):\n    while True:\n        pass"),
        fenced("def check(t):\n    return 1 / 0"),
        fenced("def check(t):\n    return 'yes'"),
        fenced(f"def check(t):\n    return open({str(path)!r}).read() == t.final_answer"),
        fenced(VERIFIER_1_1),
    ]
    vm = verdict_matrix(outputs, [TRAJ1], [[]], sandbox)
    kinds = {c.verifier: c.outcome.kind for c in vm.checks}
    assert kinds == {0: "timeout", 1: "raised", 2: "bad_return", 3: "raised", 4: "accepted"}
    assert {c.verifier for c in vm.errors} == {0, 1, 2, 3}
    assert "ZeroDivisionError" in next(c.outcome.reason for c in vm.checks if c.verifier == 1)
    # 0-3 errored on the only original, so they are invalid: only 4 has a row in Z
    assert vm.valid == [4] and sorted(vm.runtime_invalid) == [0, 1, 2, 3]
    np.testing.assert_array_equal(vm.z_orig, [[1]])
    assert vm.validity[4] == "valid" and "timeout" in vm.validity[0] and "bad_return" in vm.validity[2]


def test_ragged_variants_are_refused(sandbox):
    with pytest.raises(ValueError):
        verdict_matrix([fenced(ACCEPT_ALL)], [TRAJ1, WRONG], [[None], [None, None]], sandbox)
    with pytest.raises(ValueError):
        verdict_matrix([fenced(ACCEPT_ALL)], [TRAJ1, WRONG], [[None]], sandbox)
