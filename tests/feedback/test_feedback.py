"""One task end to end on the paper's example: perturb, verdict, rewards, record."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.feedback.loop_feedback import feedback_and_record
from tests.feedback.paper_examples import TRAJ1, VERIFIER_1_1, VERIFIER_1_2, fenced

from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.diagnostics.records import RecordWriter, load_records, records_dataframe
from unifiedplayers.feedback.trajectory import Trajectory, code_step, output_step, reason_step

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
WRONG = Trajectory(TRAJ1.question, [reason_step("Count them."), code_step("print(8)"), output_step("8")], "8")



def test_task_feedback_on_trajectory_1(sandbox, tmp_path):
    from hydra import compose, initialize_config_dir

    from unifiedplayers.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=["perturbation=global", "reward=default"])
    engine = PerturbationEngine.from_config(cfg.perturbation, seed=0, sandbox=sandbox)
    outputs = [fenced(VERIFIER_1_1), "no code", fenced(VERIFIER_1_2)]
    record, r = feedback_and_record(TRAJ1.question, [TRAJ1, WRONG], outputs, engine, sandbox, cfg.reward,
                                    history=[TRAJ1.question], task_id="q0", iteration=0)
    # Z_orig: 1.1 accepts τ_0 only, 1.2 accepts both (output == answer in each)
    np.testing.assert_array_equal(record.z_orig, [[1, 0], [1, 1]])
    # r_S = column means = [1, 1/2]
    np.testing.assert_allclose(r.execution, [1.0, 0.5])
    # variants (early_terminate, tool_substitute):
    #  1.1: early_terminate never keeps 9 for τ_0 -> reject; for τ_1 it is 9 with some draws (accept)
    #       tool_substitute keeps the answer: τ_0 accept, τ_1 reject
    #  1.2: early_terminate breaks output == answer -> reject; tool_substitute keeps it -> accept
    e1 = int(record.variants[1][0].final_answer == "9")
    np.testing.assert_array_equal(record.z_adv, [[[0, 1], [e1, 0]], [[0, 1], [0, 1]]])
    rho_adv = np.array([(1 + 0 + (1 - e1) + 1) / 4, 2 / 4])
    np.testing.assert_allclose(r.adv, rho_adv)
    np.testing.assert_allclose(r.gold, [0.5, 1.0])
    assert r.evaluation[1] == -1.0  # the invalid output
    np.testing.assert_allclose(r.evaluation[[0, 2]], 0.4 * r.gold + 0.5 * rho_adv - 0.1 * r.red)
    # U: answers 9, 8 -> p̂ = 1/2 -> U = 1/2; V = Σ ρ_adv / M (M = 3); R = 1 (the question was seen)
    assert r.uncertainty == 0.5 and r.repetition == pytest.approx(1.0)
    assert r.writability == pytest.approx(rho_adv.sum() / 3)
    assert r.planning == pytest.approx(0.5 + rho_adv.sum() / 3 - 0.5)
    # "no code" has no fence, so it is read as bare code, which does not parse
    validity = record.meta["verifier_validity"]
    assert [i for i, v in enumerate(validity) if v != "valid"] == [1] and validity[1].startswith("does not compile")
    with RecordWriter(tmp_path / "records.jsonl") as w:
        w.append(record)
    (back,) = load_records(tmp_path / "records.jsonl")
    np.testing.assert_array_equal(back.z, record.z)
    assert back.rewards["planning"] == pytest.approx(r.planning)
    df = records_dataframe(tmp_path / "records.jsonl")
    assert df.iloc[0]["reward/U"] == 0.5 and df.iloc[0].M_q == 2
