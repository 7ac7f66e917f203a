"""One seed gives one run whatever the load: two runs of the tiny preset started together beside a
process that keeps a core busy write the same records and metrics (tests/determinism.py). The comparison itself is
checked on hand-made run directories."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import determinism

pytestmark = pytest.mark.cpu


def _write(run: Path, records: list, metrics: list) -> Path:
    run.mkdir(parents=True)
    for name, lines in (("records.jsonl", records), ("metrics.jsonl", metrics)):
        (run / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_first_difference_names_the_first_differing_field_and_ignores_timings(tmp_path):
    rec = {"q": "What is 6 * 7?", "error_adv": [[[False, True]]], "reward": 0.5}
    met = {"planning/loss": 0.25, "timing/total_s": 3.0, "perf/tokens_per_s": 9.0}
    a = _write(tmp_path / "a", [rec, rec], [met])
    same = _write(tmp_path / "same", [rec, rec], [dict(met, **{"timing/total_s": 7.5, "perf/tokens_per_s": 1.0})])
    assert determinism.first_difference(a, same) is None
    flipped = dict(rec, error_adv=[[[True, True]]])
    b = _write(tmp_path / "b", [rec, flipped], [met])
    assert determinism.first_difference(a, b) == "records[1].error_adv[0][0][0]: 'False' against 'True'"
    c = _write(tmp_path / "c", [rec, rec], [dict(met, **{"planning/loss": 0.2500001})])
    assert determinism.first_difference(a, c).startswith("metrics[0].planning/loss")
    d = _write(tmp_path / "d", [rec], [met])
    assert determinism.first_difference(a, d) == "records: 2 items against 1"
    empty = _write(tmp_path / "e", [], [])
    assert determinism.first_difference(empty, empty) == "records.jsonl: neither run wrote any"


@pytest.mark.slow
def test_two_tiny_runs_of_one_seed_beside_a_busy_core_are_identical(tmp_path):
    """The neighbour runs at niceness 19: the suite's other worker keeps the cores busy too, and a neighbour of
    equal priority took a core's worth of CPU from it (this test: 53 s in the suite against 18-21 s alone)."""
    got = determinism.run_pair(["experiment=tiny", "seed=3", "trainer.num_threads=1"], tmp_path, neighbour=True,
                               timeout_s=600, niceness=19)
    assert got["verdict"] == "identical", got
    assert (tmp_path / "a" / "records.jsonl").read_text().count("\n") >= 2
