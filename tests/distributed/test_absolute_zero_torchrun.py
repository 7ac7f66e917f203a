"""Absolute Zero under torchrun (two gloo ranks on CPU): built code tasks cross ``DistContext.broadcast``
(their answer checks are picklable data, not closures) and grade the same on both ranks."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.distributed.launch import torchrun  # noqa: E402

pytestmark = [pytest.mark.cpu]

WORKER = Path(__file__).with_name("azr_worker.py")
RUN_TEST = "test_an_absolute_zero_run_over_two_ranks"


@pytest.fixture(scope="module")
def launch(request, tmp_path_factory):
    """One two-rank launch for the module: the broadcast check, then, when the whole-run test is selected, the
    Absolute Zero outer loop on the same ranks (a launch's start-up costs more than the check itself)."""
    root = tmp_path_factory.mktemp("azr")
    proposal = "```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n"
    loop = [str(root / "run"), str(root / "weights"), "method=absolute_zero", "player.topics=[deduction]",
            f"player.planning.response_prefix='{proposal}'", "trainer.micro_batch_size=1"]
    with_run = any(item.name == RUN_TEST for item in request.session.items)
    torchrun(WORKER, str(root / "out"), *(loop if with_run else []), timeout=600 if with_run else 300)
    return root


def test_two_ranks_broadcast_built_code_tasks(launch):
    tmp_path = launch
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


@pytest.mark.slow
def test_an_absolute_zero_run_over_two_ranks(launch):
    """The whole outer loop with method=absolute_zero over two gloo ranks (tasks built on rank 0 and
    broadcast, rewards on rank 0, updates on both; run by the module's launch after the broadcast check):
    it finishes and both ranks end with the same weights."""
    import torch

    from tests.distributed.launch import same  # noqa: E402

    from unifiedplayers.diagnostics.logging import read_metrics
    from unifiedplayers.diagnostics.records import load_records

    run_dir, dump = launch / "run", launch / "weights"
    assert [m["block"] for m in read_metrics(run_dir)] == ["planning", "execution"]
    played = [r for r in load_records(run_dir / "records.jsonl") if r.trajectories]
    assert played and all(r.expected_answer == "12" for r in played)  # f(4) = 12, computed in the sandbox
    w0, w1 = (torch.load(f"{dump}.rank{r}.pt") for r in (0, 1))
    assert all(same(w0[role], w1[role]) for role in w0)
