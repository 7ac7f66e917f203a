"""eval/probes/error_credit.py (the evidence table on crediting check errors) on two hand-written figure-1 roots."""
import json

import pytest

from eval.probes import error_credit as EC

pytestmark = pytest.mark.cpu


def _probe(run, it, valid, rej, acc, disc, errors=None, runtime_invalid=0):
    res = {"valid": valid, "adv_rejection": rej, "original_acceptance": acc, "discrimination": disc, "verifiers": 100,
           "runtime_invalid": runtime_invalid}
    if errors is not None:
        res["original_errors"] = errors
    (run / "probes").mkdir(parents=True, exist_ok=True)
    (run / "probes" / f"iter{it}.evaluation.json").write_text(json.dumps({"evaluation": res, "metrics": {}}))


def _record(iteration, error_orig, rewards):
    # K = 2 (the second unanswered), P = 1, M = 2 both valid; Z all 0
    return {"task_id": None, "iteration": iteration, "question": "q", "expected_answer": None,
            "trajectories": [{"question": "q", "steps": [], "final_answer": a} for a in ("4", None)],
            "verifiers": ["v", "w"], "variants": [[None], [None]], "z_orig": [[0, 0], [0, 0]],
            "z_adv": [[[0], [0]], [[0], [0]]], "adv_mask": [[True], [True]], "redundancy": [0.5, 0.5],
            "rules": ["step_drop"], "valid": [0, 1], "num_generated": 2, "rewards": {"evaluation": rewards},
            "error_orig": error_orig, "error_adv": [[[True], [False]], [[False], [False]]],
            "meta": {"block": "evaluation"}}


def test_compare_by_hand(tmp_path):
    fix, control = tmp_path / "fix", tmp_path / "control"
    for root, last_valid, disc in ((fix, 0.65, 0.53), (control, 0.30, 0.52)):
        run = root / "seed0"
        _probe(run, 0, 0.60, 0.10, 0.90, 0.52, errors=0.20)
        _probe(run, 3, last_valid, 0.12, 0.90, disc, runtime_invalid=30)  # an older file: no original_errors
        # the last iteration: verifier 0 crashes on the answered original (kind crashes_answered), verifier 1
        # rejects all cleanly; r_C 0.1 and 0.4 -> advantages -1 and +1 (two candidates, one std either side)
        recs = [_record(3, [[True, False], [False, False]], [0.1, 0.4])]
        (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = EC.compare(fix, control)
    row = res["arms"]["fix"][0]
    assert row["valid_delta"] == pytest.approx(0.05) and row["last"] == 3
    assert row["original_errors"] == [0.20, pytest.approx(0.30)]  # 30 run-time-invalid of 100 verifiers
    assert row["crashers_last"]["share"] == 0.5 and row["crashers_last"]["advantage"] == pytest.approx(-1.0, abs=1e-5)
    assert res["arms"]["control"][0]["valid_delta"] == pytest.approx(-0.30)
    t = res["targets"]
    assert t["valid_delta_mean_ge_0"] and t["valid_delta_every_seed_gt_-0.10"]
    assert t["crashers_le_15pct_with_negative_advantage"] is False  # 50 % > 15 %
    assert t["discrimination_within_0.02_of_control"]  # |0.53 - 0.52| = 0.01
    text = EC.to_markdown(res)
    assert "| fix | 0 | +0.05 | 20 % → 30 % |" in text and "50 %, -1.00" in text


def test_one_seed_below_the_floor_fails_the_every_seed_target(tmp_path):
    fix, control = tmp_path / "fix", tmp_path / "control"
    for s, last in ((0, 0.65), (1, 0.45)):  # Δ valid +0.05 and −0.15: mean −0.05
        _probe(fix / f"seed{s}", 0, 0.60, 0.10, 0.90, 0.52)
        _probe(fix / f"seed{s}", 3, last, 0.10, 0.90, 0.52)
    res = EC.compare(fix, control)
    assert [r["valid_delta"] for r in res["arms"]["fix"].values()] == [pytest.approx(0.05), pytest.approx(-0.15)]
    assert res["targets"]["valid_delta_mean_ge_0"] is False
    assert res["targets"]["valid_delta_every_seed_gt_-0.10"] is False
