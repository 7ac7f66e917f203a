"""eval/analysis/verifier_kinds.py on records written by hand; kinds, rewards and advantages worked out by hand."""
import json
import math

import pytest

from eval.analysis import verifier_kinds as VK

pytestmark = pytest.mark.cpu


def _traj(answer):
    return {"question": "q", "steps": [{"type": "reason", "text": "t", "code": None, "lang": None, "result": None}],
            "final_answer": answer}


def _record(z_orig, z_adv, adv_mask, valid, rewards, answers, block, iteration=1):
    m_q, p = len(z_orig), len(adv_mask[0])
    return {"task_id": None, "iteration": iteration, "question": "q", "expected_answer": None,
            "trajectories": [_traj(a) for a in answers], "verifiers": ["def check(t):\n    return True, None"] * m_q,
            "variants": [[None] * p for _ in answers], "z_orig": z_orig, "z_adv": z_adv, "adv_mask": adv_mask,
            "redundancy": [0.0] * m_q, "rules": ["step_drop", "early_terminate"][:p], "valid": valid,
            "num_generated": 4, "rewards": {"evaluation": rewards}, "meta": {"block": block}}


def test_kinds_rewards_and_advantages_by_hand(tmp_path):
    # Record A (Evaluation block), K = 2, P = 2, the second variant of trajectory 2 not applied.
    # Generated verifiers 0..3; 1 is invalid; rows of Z: 0 -> verifier 0, 1 -> verifier 2, 2 -> verifier 3.
    #   verifier 0 rejects all (its 0 in the masked cell is ignored either way)
    #   verifier 2 accepts all applied cells (the masked cell holds a 0 that must not count)
    #   verifier 3 splits
    z_orig = [[0, 0], [1, 1], [1, 0]]
    z_adv = [[[0, 0], [0, 0]], [[1, 1], [1, 0]], [[0, 0], [0, 0]]]
    mask = [[True, True], [True, False]]
    rec_a = _record(z_orig, z_adv, mask, [0, 2, 3], [0.5, -1.0, 0.4, 0.3], ["7", None], "evaluation")
    rec_a["redundancy"] = [0.8, 0.7, 0.9]  # rows 0, 1, 2: verifiers 0, 2, 3
    # Record B (Planning block): one valid verifier that rejects all, three invalid; rewards [0.5, -1, -1, -1].
    rec_b = _record([[0]], [[[0]]], [[True]], [0], [0.5, -1.0, -1.0, -1.0], ["1"], "planning", iteration=2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rec_a, rec_b)))
    res = VK.main([str(run)])

    # Advantages (population std, Eq. 17): A: mean 0.05, deviations .45 -1.05 .35 .25,
    # std = sqrt((.2025 + 1.1025 + .1225 + .0625) / 4) = sqrt(.3725) = .610328
    sd_a = math.sqrt(0.3725)
    # B: mean -0.625, deviations 1.125 and -0.375 (x3), std = sqrt((1.265625 + 3 x .140625) / 4) = sqrt(.421875)
    sd_b = math.sqrt(0.421875)
    trained = res["trained (evaluation blocks)"]["kinds"]
    assert trained["rejects_all"]["n"] == 1 and trained["rejects_all"]["mean_reward"] == pytest.approx(0.5)
    assert trained["rejects_all"]["mean_advantage"] == pytest.approx(0.45 / sd_a, rel=1e-5)
    assert trained["accepts_all"]["mean_advantage"] == pytest.approx(0.35 / sd_a, rel=1e-5)
    assert trained["discriminating"]["mean_advantage"] == pytest.approx(0.25 / sd_a, rel=1e-5)
    assert trained["invalid"]["share"] == pytest.approx(0.25)
    assert res["trained (evaluation blocks)"]["originals_answered"] == pytest.approx(0.5)

    every = res["all"]["kinds"]
    assert [every[k]["n"] for k in VK.KINDS] == [4, 0, 2, 1, 1]
    assert every["rejects_all"]["mean_reward"] == pytest.approx(0.5)
    # rejects-all advantages: .45 / sd_a (A) and 1.125 / sd_b (B)
    assert every["rejects_all"]["mean_advantage"] == pytest.approx((0.45 / sd_a + 1.125 / sd_b) / 2, rel=1e-5)
    assert every["invalid"]["mean_advantage"] == pytest.approx((-1.05 / sd_a - 3 * 0.375 / sd_b) / 4, rel=1e-5)
    it2 = res["iteration 2"]["kinds"]["discriminating"]
    assert it2["n"] == 0 and it2["mean_reward"] is None
    assert res["all"]["originals_answered"] == pytest.approx((0.5 + 1.0) / 2)
    assert "rejects all" in (run / "analysis" / "verifier_kinds.md").read_text()
    # mean ρ_red per kind, over valid verifiers only: rejects all = verifier 0 of A (0.8) and B's (0.0)
    assert trained["rejects_all"]["mean_rho_red"] == pytest.approx(0.8)
    assert every["rejects_all"]["mean_rho_red"] == pytest.approx(0.4)
    assert every["accepts_all"]["mean_rho_red"] == pytest.approx(0.7) and every["discriminating"]["mean_rho_red"] == 0.9
    assert every["invalid"]["mean_rho_red"] is None
    assert "ρ_red is then about 0.8" in (run / "analysis" / "verifier_kinds.md").read_text()


def test_a_check_that_errors_on_every_answered_original_is_its_own_kind(tmp_path):
    # K = 3: trajectories 0 and 2 answered, 1 unanswered; P = 1. Four generated, all valid:
    #   v0 errors on both answered originals and rejects the unanswered one cleanly -> crashes_answered
    #   v1 errors on one answered original only (accepts the other) -> discriminating
    #   v2 rejects everything cleanly -> rejects_all; v3 accepts everything -> accepts_all
    z_orig = [[0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]]
    z_adv = [[[0], [0], [0]], [[1], [0], [0]], [[0], [0], [0]], [[1], [1], [1]]]
    rec = _record(z_orig, z_adv, [[True]] * 3, [0, 1, 2, 3], [0.1, 0.3, 0.45, 0.4], ["7", None, "8"], "evaluation")
    rec["rules"] = ["step_drop"]
    rec["error_orig"] = [[True, False, True], [False, False, True], [False] * 3, [False] * 3]
    rec["error_adv"] = [[[True], [False], [True]], [[False], [False], [True]], [[False]] * 3, [[False]] * 3]
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(json.dumps(rec) + "\n")
    res = VK.main([str(run)])["trained (evaluation blocks)"]["kinds"]
    assert [res[k]["n"] for k in VK.KINDS] == [0, 1, 1, 1, 1]
    # advantages (Eq. 17): mean 0.3125, deviations -.2125 -.0125 .1375 .0875, over their population std
    dev = [-0.2125, -0.0125, 0.1375, 0.0875]
    sd = math.sqrt(sum(d * d for d in dev) / 4)
    assert res["crashes_answered"]["mean_advantage"] == pytest.approx(dev[0] / sd, rel=1e-5)
    assert res["rejects_all"]["mean_advantage"] == pytest.approx(dev[2] / sd, rel=1e-5)
    assert "errors on answered originals" in (run / "analysis" / "verifier_kinds.md").read_text()
    # with every original unanswered there is no answered original to crash on: the clean rejecter is rejects_all
    from unifiedplayers.feedback.kinds import verifier_kind
    import numpy as np
    err = np.array([[True, False, True]])
    assert verifier_kind(0, np.zeros((1, 3)), np.zeros((1, 3, 1)), np.ones((3, 1), bool), err, [False] * 3) == \
        "rejects_all"
    assert verifier_kind(0, np.zeros((1, 3)), np.zeros((1, 3, 1)), np.ones((3, 1), bool), err, [True, False, True]) \
        == "crashes_answered"
    assert verifier_kind(None, np.zeros((1, 3)), np.zeros((1, 3, 1)), np.ones((3, 1), bool), err, [True] * 3) == \
        "invalid"
    # accepting 5 of 6 cells is not accepting all: one rejected variant makes it discriminating
    z_adv = np.ones((1, 3, 1))
    z_adv[0, 2, 0] = 0
    assert verifier_kind(0, np.ones((1, 3)), z_adv, np.ones((3, 1), bool), None, [True] * 3) == "discriminating"
    assert verifier_kind(0, np.ones((1, 3)), np.ones((1, 3, 1)), np.ones((3, 1), bool), None, [True] * 3) == \
        "accepts_all"
