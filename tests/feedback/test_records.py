"""The interaction record ξ(q): JSONL round trip, crash safety, pandas."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from tests.feedback.paper_examples import TRAJ1, TRAJ2, VERIFIER_1_1, VERIFIER_1_2

from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.diagnostics.records import InteractionRecord, RecordWriter, load_records, records_dataframe


def append_record(path, record):
    with RecordWriter(path) as w:
        w.append(record)


def make_record(task_id="t0", m_q=2):
    trajs = [TRAJ1, TRAJ2]
    variants = PerturbationEngine(["step_drop", "early_terminate"], seed=0).perturb_many(trajs)
    variants[1][0] = None  # as if a rule could not apply
    return InteractionRecord(
        question=TRAJ1.question,
        trajectories=trajs,
        verifiers=[VERIFIER_1_1, VERIFIER_1_2][:m_q],
        variants=variants,
        z_orig=np.array([[1, 0], [1, 1]])[:m_q],
        z_adv=np.array([[[1, 0], [0, 0]], [[1, 0], [0, 1]]])[:m_q],
        adv_mask=[[True, True], [False, True]],
        redundancy=[0.25, 0.25][:m_q],
        rules=["step_drop", "early_terminate"],
        valid=[0, 2][:m_q],
        num_generated=4,
        task_id=task_id,
        iteration=1,
        rewards={"execution": np.array([1.0, 0.5]), "planning": np.float64(0.3)},
    )


def assert_same(a: InteractionRecord, b: InteractionRecord):
    assert a.question == b.question and a.trajectories == b.trajectories and a.variants == b.variants
    assert a.verifiers == b.verifiers and a.rules == b.rules and a.valid == b.valid
    for f in ("z_orig", "z_adv", "adv_mask", "redundancy"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert getattr(a, f).dtype == getattr(b, f).dtype
    assert (a.task_id, a.iteration, a.num_generated) == (b.task_id, b.iteration, b.num_generated)


def test_record_round_trip(tmp_path):
    rec = make_record()
    assert rec.z.shape == (2, 2 * 3)
    np.testing.assert_array_equal(rec.z, [[1, 0, 1, 0, 0, 0], [1, 1, 1, 0, 0, 1]])
    back = InteractionRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert_same(rec, back)
    assert back.rewards == {"execution": [1.0, 0.5], "planning": 0.3}
    path = tmp_path / "run" / "records.jsonl"
    append_record(path, rec)
    append_record(path, make_record("t1", m_q=0))  # a task without valid verifiers
    loaded = load_records(path)
    assert len(loaded) == 2
    assert_same(rec, loaded[0])
    assert loaded[1].z_orig.shape == (0, 2) and loaded[1].z_adv.shape == (0, 2, 2)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError):
        InteractionRecord(TRAJ1.question, [TRAJ1], [], [[None, None]], [], [], [[True, True]], [], ["a"], [], 1)


def test_torn_last_line_is_skipped_with_a_warning_and_cut_before_appending(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        for i in range(3):
            w.append(make_record(f"t{i}"))
    full = path.read_bytes()
    path.write_bytes(full + full.splitlines(keepends=True)[0][:57])  # a 4th write killed midway
    with pytest.warns(RuntimeWarning, match="torn"):
        assert [r.task_id for r in load_records(path)] == ["t0", "t1", "t2"]
    with pytest.warns(RuntimeWarning, match="torn"):
        w = RecordWriter(path)  # resuming the run cuts the torn tail off
    w.append(make_record("t3"))
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.task_id for r in load_records(path)] == ["t0", "t1", "t2", "t3"]


def test_a_whole_last_record_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "records.jsonl"
    append_record(path, make_record("t0"))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.task_id for r in load_records(path)] == ["t0"]
        append_record(path, make_record("t1"))  # the newline is restored, nothing is dropped
        assert [r.task_id for r in load_records(path)] == ["t0", "t1"]


def test_corruption_in_the_middle_raises(tmp_path):
    path = tmp_path / "records.jsonl"
    append_record(path, make_record("t0"))
    with open(path, "ab") as f:
        f.write(b"{not json}\n")
    append_record(path, make_record("t1"))
    with pytest.raises(ValueError, match=":2:"):
        load_records(path)


def test_a_writer_killed_mid_write_leaves_every_earlier_record_readable(tmp_path):
    path = tmp_path / "records.jsonl"
    # A child appends large records as fast as it can; it is killed by SIGKILL at an arbitrary point.
    child = textwrap.dedent(f"""
        from tests.feedback.test_records import make_record
        from unifiedplayers.diagnostics.records import RecordWriter
        rec = make_record()
        rec.meta["pad"] = "x" * 200_000
        with RecordWriter({str(path)!r}) as w:
            print("ready", flush=True)
            i = 0
            while True:
                rec.task_id = f"t{{i}}"
                w.append(rec)
                i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))  # tests.* importable
    assert proc.stdout.readline().strip() == b"ready"
    deadline = time.time() + 20
    while (not path.exists() or path.stat().st_size < 2_000_000) and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records = load_records(path)
    assert len(records) >= 5
    assert [r.task_id for r in records] == [f"t{i}" for i in range(len(records))]
    assert all(len(r.meta["pad"]) == 200_000 for r in records)


def test_records_dataframe(tmp_path):
    path = tmp_path / "records.jsonl"
    append_record(path, make_record("t0"))
    append_record(path, make_record("t1", m_q=0))
    df = records_dataframe(path)
    assert isinstance(df, pd.DataFrame) and list(df.task_id) == ["t0", "t1"]
    row = df.iloc[0]
    assert (row.K, row.M, row.M_q, row.P, row.variants_present) == (2, 4, 2, 2, 3)
    # Z_orig [[1,0],[1,1]]: 3 of 4 accepted
    assert row.orig_accept_rate == 0.75
    # present variants (k,j) = (0,0), (0,1), (1,1): z = [1,0,0] and [1,0,1] -> 3 of 6 accepted -> 3/6 rejected
    assert row.adv_reject_rate == pytest.approx(3 / 6)
    assert row["reward/planning"] == 0.3 and row.answers == ["9", "23"]
    assert np.isnan(df.iloc[1].orig_accept_rate)
    # the raw file is plain JSON lines for pandas too
    raw = pd.read_json(path, lines=True)
    assert list(raw.task_id) == ["t0", "t1"] and raw.iloc[0].z_orig == [[1, 0], [1, 1]]
