"""Check errors kept apart from rejections (the paper defines a verdict only for a completed check, B.1): a raise, a timeout or a
non-verdict return is 0 in Z (the paper's Z), marked in error masks, recorded in ξ(q); a verifier that
errors on every original is invalid; an error on a variant earns no ρ_adv credit (unless reward=errors_credited)."""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
from tests.feedback.loop_feedback import feedback_and_record
from tests.feedback.paper_examples import fenced

from unifiedplayers.feedback import rewards
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.diagnostics.records import InteractionRecord, RecordWriter, load_records, records_dataframe
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
ACCEPT_ALL = "def check(trajectory):\n    return True\n"
CRASH_ALWAYS = "def check(trajectory):\n    raise ValueError('boom')\n"
# Both tell a python step from a bash one (tool_substitute); one says so, the other crashes.
HONEST = ("def check(trajectory):\n    for i, s in enumerate(trajectory.steps):\n"
          "        if s.type == 'code' and s.lang != 'python':\n            return (False, i)\n    return True\n")
CRASHY = ("def check(trajectory):\n    for i, s in enumerate(trajectory.steps):\n"
          "        if s.type == 'code' and s.lang != 'python':\n            raise RuntimeError(i)\n    return True\n")

Q = "Alice has 4 bags of 2 apples and finds 1 more. How many apples?"
T0 = Trajectory(Q, [reason_step("Count."), code_step("print(4 * 2 + 1)"), output_step("9")], "9")
T1 = Trajectory(Q, [reason_step("Count."), code_step("print(4 * 2)"), output_step("8")], "8")


def _compose_reward(preset):
    from hydra import compose, initialize_config_dir

    from unifiedplayers.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("config", overrides=[f"reward={preset}"]).reward


@pytest.fixture(scope="module")
def reward_cfg():
    cfg = _compose_reward("default")
    assert (cfg.alpha, cfg.beta, cfg.gamma) == (0.4, 0.5, 0.1) and cfg.invalid_verifier_reward == -1.0
    return cfg



def _feedback(sandbox, reward_cfg, verifiers):
    engine = PerturbationEngine(["tool_substitute"], seed=0)  # P = 1: the python step becomes bash
    return feedback_and_record(Q, [T0, T1], [fenced(v) for v in verifiers], engine, sandbox, reward_cfg)


def test_paper_literal_z_lets_crash_always_beat_accept_all():
    # What Eq. 5 and Eq. 3 give when the crash-always verifier keeps its row (K = 2, P = 1, M = 2):
    # accept-all: Z = [1 1 | 1 1] -> ρ_gold = 1, ρ_adv = 0 -> r_C = 0.4·1 + 0.5·0 − 0.1·s = 0.4 − 0.1·s
    # crash-always: Z = [0 0 | 0 0] -> ρ_gold = 0, ρ_adv = 1 -> r_C = 0.4·0 + 0.5·1 − 0.1·s = 0.5 − 0.1·s
    # (s = their similarity, ρ_red of both); V(q) = (0 + 1) / 2 = 0.5 instead of 0.
    z_orig = np.array([[1, 1], [0, 0]])
    z_adv = np.array([[[1], [1]], [[0], [0]]])
    s = 0.3
    adv = rewards.adversarial_rejection_rate(z_adv)
    r_c = rewards.evaluation_rewards(rewards.gold_pass_rate(z_orig), adv, np.array([s, s]), 0.4, 0.5, 0.1)
    np.testing.assert_allclose(r_c, [0.4 - 0.1 * s, 0.5 - 0.1 * s])
    assert rewards.verifier_writability(adv, 2) == pytest.approx(0.5)


def test_crash_always_is_invalid_and_cannot_raise_v(sandbox, reward_cfg):
    record, r = _feedback(sandbox, reward_cfg, [ACCEPT_ALL, CRASH_ALWAYS])
    # the crash-always verifier errored on both originals -> invalid: no row, not in M_q
    assert record.valid == [0] and record.num_generated == 2 and list(record.runtime_invalid) == [1]
    assert "raised" in record.runtime_invalid[1] and "ValueError" in record.runtime_invalid[1]
    validity = record.meta["verifier_validity"]
    assert validity[0] == "valid" and validity[1] == record.runtime_invalid[1]
    # r_C: accept-all alone (ρ_red = 0): 0.4·1 + 0.5·0 − 0.1·0 = 0.4; crash-always: invalid_verifier_reward
    np.testing.assert_allclose(r.evaluation, [0.4, -1.0])
    # r_S over M_q = 1: both trajectories accepted by accept-all
    np.testing.assert_allclose(r.execution, [1.0, 1.0])
    # V(q) = (1/M) Σ_valid ρ_adv = (1/2)·0 = 0; U = min(1/2, 1/2) (answers 9, 8); R = 0 (no history)
    assert r.writability == 0.0 and r.uncertainty == 0.5 and r.repetition == 0.0
    assert r.planning == pytest.approx(1.0 * 0.5 + 1.0 * 0.0 - 0.5 * 0.0)
    # ... the same V(q) and r_T as with accept-all alone: the crash-always verifier raised nothing
    _, alone = _feedback(sandbox, reward_cfg, [ACCEPT_ALL])
    assert alone.writability == r.writability == 0.0 and alone.planning == pytest.approx(r.planning)
    # and it scores below accept-all (−1.0 < 0.4), where the paper-literal Z put it above (0.5 − 0.1·s)
    assert r.evaluation[1] < r.evaluation[0]


def test_an_error_on_a_variant_earns_no_credit_unless_errors_are_credited(sandbox, reward_cfg):
    assert not reward_cfg.variant_error_credit  # the default (SPEC §5): an error is not a verdict
    record, r = _feedback(sandbox, reward_cfg, [HONEST, CRASHY])
    # Z (the paper's): both accept the originals and have 0 on the bash variants
    np.testing.assert_array_equal(record.z_orig, [[1, 1], [1, 1]])
    np.testing.assert_array_equal(record.z_adv, [[[0], [0]], [[0], [0]]])
    # ... but the crashy zeros are errors, not rejections
    np.testing.assert_array_equal(record.error_orig, [[False, False], [False, False]])
    np.testing.assert_array_equal(record.error_adv, [[[False], [False]], [[True], [True]]])
    # ρ_adv: honest (1 + 1)/2 = 1; crashy (0 + 0)/2 = 0 (errors stay in the count, earn nothing)
    np.testing.assert_allclose(r.adv, [1.0, 0.0])
    np.testing.assert_allclose(r.gold, [1.0, 1.0])
    # r_C = 0.4·1 + 0.5·ρ_adv − 0.1·ρ_red, ρ_red the same for both (each other's similarity): gap 0.5·(1 − 0)
    assert r.red[0] == pytest.approx(r.red[1])
    assert r.evaluation[0] - r.evaluation[1] == pytest.approx(0.5)
    np.testing.assert_allclose(r.evaluation, [0.4 + 0.5 - 0.1 * r.red[0], 0.4 - 0.1 * r.red[0]])
    # V(q) = (1 + 0) / 2 = 0.5 (crediting errors would give (1 + 1) / 2 = 1)
    assert r.writability == pytest.approx(0.5)
    # reward=errors_credited (the ablation): an error on a variant counts as a rejection (Eq. 11 read literally)
    credited = _compose_reward("errors_credited")
    assert credited.variant_error_credit and credited.name == "errors_credited"
    assert {k: v for k, v in dict(credited).items() if k not in ("name", "variant_error_credit")} == \
        {k: v for k, v in dict(reward_cfg).items() if k not in ("name", "variant_error_credit")}
    _, r_lit = _feedback(sandbox, credited, [HONEST, CRASHY])
    np.testing.assert_allclose(r_lit.adv, [1.0, 1.0])
    assert r_lit.writability == pytest.approx(1.0)


def test_partial_errors_are_masked_summarised_and_saved(sandbox, reward_cfg, tmp_path):
    # raises on τ_1 (answer 8) only, and on its variant; accepts τ_0 and τ_0's variant
    picky = ("def check(trajectory):\n    if trajectory.final_answer == '8':\n        raise KeyError('8')\n"
             "    return True\n")
    record, r = _feedback(sandbox, reward_cfg, [picky])
    assert record.valid == [0] and record.runtime_invalid == {}  # one original accepted: still valid
    np.testing.assert_array_equal(record.z_orig, [[1, 0]])  # the error is 0 in Z, as the paper's junk
    np.testing.assert_array_equal(record.error_orig, [[False, True]])
    np.testing.assert_array_equal(record.error_adv, [[[False], [True]]])
    np.testing.assert_allclose(r.execution, [1.0, 0.0])  # r_S reads Z_orig unchanged
    from unifiedplayers.diagnostics.summary import verdict_table

    # the summary's verdict matrix shows an error as e, not as a 0 that reads like a rejection
    assert verdict_table(record).splitlines()[1].split() == ["v0", "1", "1", "e", "e"]
    # checks = M_q·K + M_q·(present variants) = 1·2 + 1·2 = 4; errors 1 + 1 -> rate 2/4
    summary = record.error_summary()
    assert summary == {"checks": 4, "errors_orig": 1, "errors_adv": 1, "error_rate": 0.5, "runtime_invalid": 0}
    with RecordWriter(tmp_path / "records.jsonl") as w:
        w.append(record)
    (back,) = load_records(tmp_path / "records.jsonl")
    np.testing.assert_array_equal(back.error_orig, record.error_orig)
    np.testing.assert_array_equal(back.error_adv, record.error_adv)
    row = records_dataframe([back]).iloc[0]
    assert row.check_errors_orig == 1 and row.check_errors_adv == 1 and row.check_error_rate == 0.5


def test_verdict_summary_counts_kinds_and_runtime_invalid(sandbox):
    from unifiedplayers.feedback.verdict import verdict_matrix

    junk = "def check(trajectory):\n    return 'True'\n"  # a string, not a verdict
    vm = verdict_matrix([fenced(ACCEPT_ALL), fenced(CRASH_ALWAYS), fenced(junk)], [T0, T1], [[None], [None]], sandbox)
    assert vm.valid == [0] and sorted(vm.runtime_invalid) == [1, 2]
    s = vm.error_summary()
    # over the valid verifier's 2 checks: no error; over all 6 executed checks: 2 raised, 2 bad_return
    assert (s["checks"], s["errors_orig"], s["errors_adv"], s["error_rate"], s["runtime_invalid"]) == (2, 0, 0, 0.0, 2)
    assert (s["errors/raised"], s["errors/timeout"], s["errors/bad_return"]) == (2, 0, 2)


def test_records_written_before_error_masks_still_load():
    d = InteractionRecord(question="q", trajectories=[T0], verifiers=["v"], variants=[[]], z_orig=[[1]],
                          z_adv=[[[]]], adv_mask=[[]], redundancy=[0.0], rules=[], valid=[0],
                          num_generated=1).to_dict()
    for key in ("error_orig", "error_adv", "runtime_invalid"):
        del d[key]
    back = InteractionRecord.from_dict(d)
    np.testing.assert_array_equal(back.error_orig, [[False]])
    assert back.error_adv.shape == (1, 1, 0) and back.runtime_invalid == {}


def test_the_progress_callback_sees_every_task_in_order(sandbox, reward_cfg):
    """FeedbackContext.progress wraps the verdict stage (the loop's tqdm bar): it gets the tasks in order, once."""
    from tests.feedback.loop_feedback import task_feedback

    seen = []

    def progress(items, desc):
        seen.append((len(items), desc))
        return items

    engine = PerturbationEngine(["tool_substitute"], seed=0)
    with_bar = task_feedback(Q, [T0, T1], [fenced(ACCEPT_ALL)], engine, sandbox, reward_cfg, progress=progress)
    assert seen == [(1, "sandbox: verdicts")]
    plain = task_feedback(Q, [T0, T1], [fenced(ACCEPT_ALL)], engine, sandbox, reward_cfg)
    np.testing.assert_allclose(with_bar.terms.evaluation, plain.terms.evaluation)
