"""Each analysis on a small run directory written by hand, with the expected numbers worked out by hand."""
import json
import math

import pytest

from eval.analysis import compute, curves, diagnostics, discrimination, reward_variance
from eval.analysis import all as all_analyses
from eval.analysis.rundir import load_run

pytestmark = pytest.mark.cpu


def traj(answer):
    return {"question": "q", "steps": [{"type": "reason", "text": "t", "code": None, "lang": None, "result": None}],
            "final_answer": answer}


def record(z_orig, z_adv, adv_mask, rules, answers, iteration=1):
    """One line of records.jsonl in the field names of unifiedplayers.diagnostics.records.InteractionRecord.to_dict."""
    k, m_q, p = len(answers), len(z_orig), len(rules)
    return {
        "task_id": None, "iteration": iteration, "question": "q", "expected_answer": None,
        "trajectories": [traj(a) for a in answers], "verifiers": [f"def check(t):\n    return {i}" for i in range(m_q)],
        "variants": [[None] * p for _ in range(k)], "z_orig": z_orig, "z_adv": z_adv, "adv_mask": adv_mask,
        "redundancy": [0.0] * m_q, "rules": rules, "valid": list(range(m_q)), "num_generated": 4,
        "rewards": {}, "meta": {},
    }


def write_run(tmp_path, records=(), metrics=(), summary=None):
    run = tmp_path / "run"
    run.mkdir()
    if records:
        (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if metrics:
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


RULES = ["step_drop", "early_terminate"]
REC_A = record([[1, 1], [1, 0]], [[[0, 0], [0, 1]], [[1, 0], [0, 0]]], [[True, True], [True, True]], RULES, ["1", "2"])
REC_EMPTY = record([], [], [[True, True], [True, True]], RULES, ["1", "2"])
REC_C = record([[0]], [[[0, 1]]], [[True, False]], RULES, ["3"])
# A malformed Planning output: recorded, but with no trajectories; every analysis must ignore it.
REC_MALFORMED = record([], [], [], RULES, [])


def test_discrimination_per_rule_and_overall(tmp_path):
    run = write_run(tmp_path, records=[REC_A, REC_EMPTY, REC_C, REC_MALFORMED])
    res = discrimination.main([str(run)])
    assert res["num_tasks"] == 3
    v = res["levels"]["verifier"]
    assert v["original_acceptance"] == pytest.approx(3 / 5)
    assert v["per_rule"]["step_drop"]["rejection"] == pytest.approx(4 / 5)
    assert v["per_rule"]["early_terminate"]["rejection"] == pytest.approx(3 / 4)  # masked cell left out
    assert v["per_rule"]["early_terminate"]["n"] == 4
    assert v["perturbation_rejection"] == pytest.approx(7 / 9)
    assert v["balanced_accuracy"] == pytest.approx(0.5 * (3 / 5 + 7 / 9))
    assert v["raw_accuracy"] == pytest.approx(10 / 14)
    pool = res["levels"]["pool"]  # strict majority; a 1-1 tie rejects
    assert pool["original_acceptance"] == pytest.approx(1 / 3)
    assert pool["perturbation_rejection"] == pytest.approx(1.0)
    assert res["headline"] == pytest.approx(0.5 * (3 / 5 + 7 / 9))
    assert res["num_tasks_with_valid_verifier"] == 2
    assert (run / "analysis" / "discrimination.md").read_text().count("|") > 10


def test_discrimination_counts_an_error_as_no_verdict(tmp_path):
    # K = 2, P = 1 (step_drop), three valid verifiers. Z as the reward saw it (an error is 0):
    #   v0: accepts both originals, rejects both variants with a verdict
    #   v1: accepts original 0, errors on original 1; errors on both variants (Z 0 but no rejection)
    #   v2: rejects original 0, accepts original 1; accepts variant 0, errors on variant 1
    rec = record([[1, 1], [1, 0], [0, 1]], [[[0], [0]], [[0], [0]], [[1], [0]]], [[True], [True]], ["step_drop"],
                 ["1", "2"])
    rec["error_orig"] = [[False, False], [False, True], [False, False]]
    rec["error_adv"] = [[[False], [False]], [[True], [True]], [[False], [True]]]
    res = discrimination.main([str(write_run(tmp_path, records=[rec]))])
    v = res["levels"]["verifier"]
    # originals: right = accepted = 1 + 1 + 0 + ... -> v0 2, v1 1, v2 1 of 6 = 4/6; variants: only v0's 2 clean
    # rejections are right, of 6 checks (v1's two errors and v2's error are no rejection) = 2/6
    assert v["original_acceptance"] == pytest.approx(4 / 6)
    assert v["perturbation_rejection"] == pytest.approx(2 / 6)
    assert v["balanced_accuracy"] == pytest.approx(0.5 * (4 / 6 + 2 / 6))
    pool = res["levels"]["pool"]
    # pool, over the completed checks: original 0: 3 completed, 2 accept -> accept; original 1: v0 and v2 completed,
    # both accept -> accept (2/2). Variant 0: v0 rejects, v2 accepts (v1 errored): 1 of 2 accept, a tie -> reject
    # (right); variant 1: only v0 completed and rejects -> reject (right).
    assert pool["original_acceptance"] == pytest.approx(1.0)
    assert pool["perturbation_rejection"] == pytest.approx(1.0)
    # reading the same Z without its masks (an older record) counts v1's and v2's errors as rejections
    del rec["error_orig"], rec["error_adv"]
    (tmp_path / "old").mkdir()
    old = discrimination.main([str(write_run(tmp_path / "old", records=[rec]))])["levels"]["verifier"]
    assert old["perturbation_rejection"] == pytest.approx(5 / 6) and old["original_acceptance"] == pytest.approx(4 / 6)


def test_reward_variance_against_majority_vote(tmp_path):
    r1 = record([[1, 1, 0, 0], [1, 0, 0, 0]], [[[]] * 4] * 2, [[]] * 4, [], ["2", "2", "2.0", "3"])
    r2 = record([[1, 0, 1, 0]], [[[]] * 4], [[]] * 4, [], [r"\frac{1}{2}", "0.5", "1/2", None])
    r3 = record([], [], [[]] * 4, [], ["1", "1", "1", "1"])
    run = write_run(tmp_path, records=[r1, r2, r3, REC_MALFORMED])
    res = reward_variance.main([str(run)])
    # r_S = [1, .5, 0, 0] -> var .171875;  [1, 0, 1, 0] -> .25.  Majority vote: [1,1,1,0] twice -> .1875
    assert res["per_question"]["unifiedplayers"] == pytest.approx([0.171875, 0.25])
    assert res["per_question"]["self_consistency"] == pytest.approx([0.1875, 0.1875])
    assert res["ratio"] == pytest.approx(0.2109375 / 0.1875)
    assert res["num_used"] == 2 and res["skipped_no_valid_verifier"] == 1
    assert (run / "analysis" / "reward_variance.png").stat().st_size > 1000


def test_curves_from_metrics_and_from_records(tmp_path):
    metrics = [
        {"outer_iteration": 1, "block": "planning", "update": 0, "planning/U": 0.1},
        {"outer_iteration": 1, "block": "planning", "update": 1, "planning/U": 0.3},
        {"outer_iteration": 1, "block": "execution", "update": 0, "execution/accuracy": 0.4},
        {"outer_iteration": 1, "block": "execution", "update": 1, "execution/accuracy": 0.5},
        {"outer_iteration": 1, "block": "evaluation", "update": 0, "evaluation/rho_adv": 0.2},
        {"outer_iteration": 1, "block": "evaluation", "update": 1, "evaluation/rho_adv": 0.4},
        {"outer_iteration": 2, "block": "planning", "update": 0, "planning/U": 0.4},
        {"outer_iteration": 2, "block": "execution", "update": 0, "execution/accuracy": 0.6},
        {"outer_iteration": 2, "block": "evaluation", "update": 0, "evaluation/rho_adv": 0.7},
    ]
    run = write_run(tmp_path, metrics=metrics)
    res = curves.main([str(run)])
    assert res["mean_U"] == pytest.approx({"1": 0.2, "2": 0.4})
    assert res["execution_accuracy"] == pytest.approx({"1": 0.5, "2": 0.6})
    assert res["adversarial_rejection"] == pytest.approx({"1": 0.3, "2": 0.7})
    assert (run / "analysis" / "curves.png").stat().st_size > 1000

    # Without the metrics, U and the rejection rate come from the records of each iteration.
    rec = record([[1, 1, 1, 1]], [[[0], [1], [0], [0]]], [[True]] * 4, ["step_drop"], ["2", "2", "2", "3"], iteration=1)
    (tmp_path / "b").mkdir()
    run2 = write_run(tmp_path / "b", records=[rec])
    res2 = curves.main([str(run2)])
    assert res2["mean_U"] == pytest.approx({"1": 0.25})  # p̂ = 3/4
    assert res2["adversarial_rejection"] == pytest.approx({"1": 0.75})
    assert res2["source"]["execution_accuracy"] == "missing"
    # A check that errored on a variant is no rejection: with the third variant's 0 an error, 2 of 4 are rejections.
    rec["error_adv"] = [[[False], [False], [True], [False]]]
    (tmp_path / "b2").mkdir()
    assert curves.main([str(write_run(tmp_path / "b2", records=[rec]))])["adversarial_rejection"] == \
        pytest.approx({"1": 0.5})

    # The trainer's per-update accuracy against the verifier pool stands in for the fixed-pool accuracy.
    (tmp_path / "c").mkdir()
    run3 = write_run(tmp_path / "c", metrics=[{"outer_iteration": 1, "execution/accuracy_by_verifiers": 0.25},
                                             {"outer_iteration": 1, "execution/accuracy_by_verifiers": 0.5}])
    assert curves.main([str(run3)])["execution_accuracy"] == pytest.approx({"1": 0.5})


def test_diagnostics_table4(tmp_path):
    metrics = [{"outer_iteration": 1, "block": "execution", "update": i, "execution/grad_norm": g}
               for i, g in enumerate([1.0, 2.0, 3.0, 4.0])]
    metrics += [{"execution/kl": 0.01, "execution/clip_frac": 0.1, "execution/entropy": 2.0},
                {"execution/kl": 0.03, "execution/clip_frac": 0.3, "execution/entropy": 1.5}]
    metrics += [{"execution/accuracy": a} for a in (0.5, 0.4, 0.45, 0.3)]
    run = write_run(tmp_path, metrics=metrics)
    [row] = diagnostics.main([str(run)])
    assert row["grad_norm_median"] == pytest.approx(2.5)
    assert row["grad_norm_cv"] == pytest.approx(math.sqrt(1.25) / 2.5)
    assert row["kl"] == pytest.approx(0.02) and row["clip_frac"] == pytest.approx(0.2)
    assert row["entropy_ratio"] == pytest.approx(0.75)
    assert row["negative_step_rate"] == pytest.approx(2 / 3)
    assert row["max_drop"] == pytest.approx(15.0)
    md = (run / "analysis" / "diagnostics_execution.md").read_text()
    assert "0.73 / 0.31" in md and "2.50 / 0.45" in md


def test_diagnostics_reads_the_retention_of_the_last_block_end(tmp_path):
    """trainer.entropy_every=0 logs the ratio only on a block's last line (entropy_bank/retention), not per update;
    the sampled tokens' entropy (``<player>/entropy``) is not the bank's and is not used while the ratio is logged."""
    metrics = [{"execution/entropy": 2.0}, {"execution/entropy": 1.0, "execution/entropy_bank/retention": 0.9},
               {"execution/entropy": 1.0, "execution/entropy_bank/retention": 0.8}]
    [row] = diagnostics.main([str(write_run(tmp_path, metrics=metrics))])
    assert row["entropy_ratio"] == pytest.approx(0.8)


def test_compute_accounting(tmp_path):
    metrics = [
        {"outer_iteration": 1, "block": "planning", "timing/total_s": 1800.0},
        {"outer_iteration": 1, "block": "planning", "timing/total_s": 1800.0},
        {"outer_iteration": 1, "block": "execution", "timing/total_s": 3600.0, "timing/devices": 2},
        {"outer_iteration": 2, "block": "evaluation", "timing/rollout_s": 60.0, "timing/backward_s": 120.0},
    ]
    run = write_run(tmp_path, metrics=metrics, summary={"devices": 8})
    res = compute.main([str(run)])
    blocks = {(b["iteration"], b["block"]): b for b in res["blocks"]}
    assert blocks[(1, "planning")]["wall_h"] == pytest.approx(1.0)
    assert blocks[(1, "planning")]["device_h"] == pytest.approx(8.0)
    assert blocks[(1, "execution")]["device_h"] == pytest.approx(2.0)
    assert blocks[(2, "evaluation")]["wall_h"] == pytest.approx(180 / 3600)
    assert res["run"]["wall_h"] == pytest.approx(2.05)
    assert res["run"]["device_h"] == pytest.approx(8.0 + 2.0 + 8 * 0.05)



def test_an_updates_wall_seconds_are_its_total_not_the_sum_of_its_parts(tmp_path):
    """The loop writes ``timing/total_s`` beside the stages it sums (generation, sandbox, update): the total is read,
    so the stages are not counted twice; a row without it sums its ``timing/*_s``."""
    metrics = [{"outer_iteration": 1, "block": "planning", "timing/total_s": 3600.0, "timing/generation_s": 2400.0,
                "timing/sandbox_s": 600.0, "timing/update_s": 600.0},
               {"outer_iteration": 1, "block": "execution", "timing/generation_s": 1800.0, "timing/update_s": 1800.0}]
    res = compute.main([str(write_run(tmp_path, metrics=metrics))])
    blocks = {(b["iteration"], b["block"]): b for b in res["blocks"]}
    assert blocks[(1, "planning")]["wall_h"] == pytest.approx(1.0)
    assert blocks[(1, "execution")]["wall_h"] == pytest.approx(1.0)


def test_all_and_missing_inputs(tmp_path):
    run = write_run(tmp_path, records=[REC_A, REC_C], metrics=[{"outer_iteration": 1, "block": "execution",
                                                               "execution/grad_norm": 1.0, "timing/total_s": 10.0}])
    done = all_analyses.main([str(run)])
    assert set(done) == {"discrimination", "reward_variance", "verifier_kinds", "curves", "diagnostics", "compute"}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="records.jsonl"):
        load_run(empty, need_records=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
