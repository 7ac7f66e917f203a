"""The diagnostic pool (Appendix D.2) over two data-parallel ranks (gloo, CPU, torchrun): each rank answers its
block of the questions with its own engine and sandbox, every question is graded exactly once, by the rank whose
block holds it, and rank 0 writes the same metrics, execution_pool.jsonl rows, accuracies, negative-step rate
and maximum drop as one rank; a pool of fewer questions than ranks, a pool without questions and a pool read back
from its log keep the ranks in step (tests/distributed/pool_worker.py describes the scenarios)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from unifiedplayers.distributed import SINGLE, prompt_shard
from tests.distributed.launch import torchrun  # noqa: E402
from tests.distributed.pool_worker import right_at, run_scenarios  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("pool_worker.py")
CHECKPOINTS = range(5)  # the initial checkpoint and one after each of the 4 Execution updates


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one rank's results, [rank 0's, rank 1's] of the two-rank launch)."""
    d = tmp_path_factory.mktemp("pool_ranks")
    torchrun(WORKER, str(d / "two"), str(d / "out"), timeout=240)
    two = [json.loads(Path(f"{d / 'out'}.rank{r}.json").read_text()) for r in (0, 1)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (the tiny model's text is compared)
    try:
        one = run_scenarios(SINGLE, d / "one")
    finally:
        torch.set_num_threads(threads)
    return one, two


@pytest.mark.parametrize("name", ["scripted", "one", "none", "model", "scripted_again"])
def test_two_ranks_write_what_one_rank_writes(runs, name):
    one, two = runs
    assert two[0][name]["lines"] == one[name]["lines"]
    assert two[0][name]["rows"] == one[name]["rows"]
    assert two[0][name]["summary"] == one[name]["summary"]
    assert "lines" not in two[1][name]  # rank 1 writes nothing


def test_the_scripted_pool_is_graded_as_scripted(runs):
    one, _ = runs
    summary = one["scripted"]["summary"]
    expected = [sum(right_at(i, c) for i in range(5)) / 5 for c in CHECKPOINTS]
    assert summary["accuracy"] == pytest.approx(expected) and expected == pytest.approx([0.6, 0.8, 0.6, 0.6, 0.8])
    assert summary["negative_step_rate"] == pytest.approx(0.25) and summary["max_drop"] == pytest.approx(0.2)
    items = one["scripted"]["rows"][1]["items"]
    assert [i["domain"] for i in items] == ["math"] * 3 + ["general"] * 2
    assert all(i["status"] == "answered" and i["tool_calls"] == 1 for i in items)  # the code ran in the sandbox
    assert one["one"]["summary"]["accuracy"] == [float(right_at(0, c)) for c in CHECKPOINTS]


@pytest.mark.parametrize("name, size", [("scripted", 5), ("one", 1), ("model", 7)])
def test_every_question_is_graded_once_by_the_rank_of_its_block(runs, name, size):
    one, two = runs
    ids = [item["id"] for item in one[name]["rows"][0]["items"]]
    assert len(ids) == size
    everything = sorted((c, i) for c in CHECKPOINTS for i in ids)
    assert sorted(map(tuple, one[name]["graded"])) == everything
    assert sorted(tuple(g) for r in (0, 1) for g in two[r][name]["graded"]) == everything  # once each
    for r in (0, 1):
        block = [ids[k] for k in prompt_shard(size, r, 2)]
        assert sorted(map(tuple, two[r][name]["graded"])) == sorted((c, i) for c in CHECKPOINTS for i in block)
    assert bool(two[1][name]["graded"]) == (size > 1)  # one question: rank 1 has none, and joins the gather


def test_nothing_is_decoded_without_questions_or_with_a_logged_evaluation(runs):
    one, two = runs
    for name in ("none", "scripted_again"):
        assert one[name]["graded"] == [] and two[0][name]["graded"] == [] == two[1][name]["graded"]
    assert all(row["skipped"] for row in one["none"]["rows"]) and len(one["none"]["rows"]) == 5


def test_the_model_scenario_compares_real_text(runs):
    one, _ = runs
    tails = [item["text_tail"] for row in one["model"]["rows"] for item in row["items"]]
    assert len(tails) == 35 and all(tails) and len(set(tails)) > 7  # the checkpoints answer differently
