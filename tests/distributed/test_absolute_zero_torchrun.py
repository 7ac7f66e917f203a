"""Absolute Zero under torchrun (two gloo ranks on CPU): built code tasks cross ``DistContext.broadcast``
(their answer checks are picklable data, not closures) and grade the same on both ranks."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from launch import torchrun  # noqa: E402

pytestmark = [pytest.mark.cpu]

WORKER = Path(__file__).with_name("azr_worker.py")


def test_two_ranks_broadcast_built_code_tasks(tmp_path):
    torchrun(WORKER, str(tmp_path / "out"), timeout=120)
    r0, r1 = (json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1))
    # f(x) = 3x on inputs 4..7: deduction 12 is right, 13 wrong; abduction 4 gives 12, 5 gives 15; the
    # lookup table {4: 12, 5: 15} covers only the two shown pairs and fails on the hidden 6 and 7.
    expected = {"deduction": [True, False], "abduction": [True, False], "induction": [True, False]}
    assert r0["grades"] == r1["grades"] == expected
    assert r0["questions"] == r1["questions"]
    # rank 0 keeps its own objects (sandbox bound where code runs; deduction runs none); the sandbox is never
    # pickled, so rank 1 re-binds its own
    assert r0["unbound"] == ["deduction"]
    assert r1["unbound"] == ["deduction", "abduction", "induction"]
