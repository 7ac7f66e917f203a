"""One run over two data-parallel ranks (gloo, CPU) on the tiny random model, launched with torchrun as
a subprocess: records, metrics and checkpoints are written once (by rank 0), both ranks end with
identical weights, every trained player moved, and a stopped run resumes over the same two ranks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.diagnostics.records import load_records
from unifiedplayers.loop.outer import OuterLoop
from tests.distributed.launch import same  # noqa: E402
from tests.distributed.launch import torchrun as torchrun_worker  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("dp_worker.py")
# One outer iteration: 2 Planning updates, 1 Execution, 1 Evaluation; micro-batches of one sample, so each
# rank gets one of the two. The random model's rewards are all equal (zero advantages), so the first
# update's gradient is zero; the second Planning update has a KL gradient (π_θ ≠ π_ref after the first
# step's weight decay) that differs between the ranks' micro-batches: only the gradient all-reduce keeps
# the two ranks' weights equal.
OVERRIDES = ["trainer.micro_batch_size=1", "schedule.planning_updates=2"]


def torchrun(run_dir: Path, dump: Path, *overrides: str) -> None:
    torchrun_worker(WORKER, str(run_dir), str(dump), *OVERRIDES, *overrides, timeout=240)


DESTROY_CHECK = """
import sys
import torch.distributed as dist
import unifiedplayers.distributed as D
from unifiedplayers.distributed import DistContext

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
job = DistContext(rank=0, world_size=2)  # as a rank of a larger job sees itself
D.adopt_group()
D.destroy(job)
assert dist.is_initialized(), "destroy() took down a group its engine adopted"
D._GROUP_ADOPTED = False
D.destroy(job)
assert not dist.is_initialized(), "destroy() left our own group up"
print("ok")
"""


def test_destroy_leaves_an_adopted_group_to_its_engine(tmp_path):
    # An in-process vLLM engine destroys the process group it adopted at its own shutdown (at exit), and
    # fails if we did first: destroy() then only synchronises. A group of one process stands in for the
    # job's. It runs in its own interpreter: an in-process DeepSpeed test may already hold this one's group.
    proc = subprocess.run(
        [sys.executable, "-c", DESTROY_CHECK, str(tmp_path / "rdzv")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_two_ranks_write_once_and_end_with_identical_weights(tmp_path):
    run_dir, dump = tmp_path / "run", tmp_path / "weights"
    # Stop after the Planning block, then resume the Execution and Evaluation updates on the same two ranks.
    torchrun(run_dir, dump, "schedule.max_updates=2")
    first = [torch.load(f"{dump}.rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert len(read_metrics(run_dir)) == 2
    torchrun(run_dir, dump, "resume=true")
    final = [torch.load(f"{dump}.rank{r}.pt", weights_only=True) for r in (0, 1)]

    for role in ("planning", "execution", "evaluation"):
        assert same(final[0][role], final[1][role]), role  # the data-parallel step keeps the ranks identical
        assert same(first[0][role], first[1][role]), role
    assert not same(first[0]["planning"], first[0]["evaluation"])  # the trained players moved
    assert not same(first[0]["evaluation"], final[0]["evaluation"])

    metrics = read_metrics(run_dir)
    assert [(m["block"], m["update"]) for m in metrics] == [
        ("planning", 0), ("planning", 1), ("execution", 0), ("evaluation", 0)]
    assert all(m[f"{m['block']}/skipped"] == 0.0 for m in metrics)
    assert metrics[1]["planning/grad_norm"] > 0  # a real gradient, summed over the ranks
    records = load_records(run_dir / "records.jsonl")
    ids = [r.task_id for r in records]
    assert len(ids) == len(set(ids))  # written once, by rank 0
    played = [r for r in records if r.meta["status"] == "played"]
    # Planning updates: 1 prompt x G_T = 2 tasks; K = 2 trajectories and M = 2 verifiers per task. Sampling is
    # split by prompt: each rank draws all the samples of its prompts (a call with one prompt: rank 0 alone).
    assert len(played) == 2 + 2 + 1 + 1
    assert all(len(r.trajectories) == 2 and r.num_generated == 2 for r in played)
    state = torch.load(run_dir / "state.pt", weights_only=False)
    assert state["finished"] and state["world_size"] == 2 and state["records"] == len(records)
    for role in ("planning", "execution", "evaluation"):
        saved = torch.load(run_dir / "checkpoints" / "iter1" / role / "model.pt", weights_only=True)
        assert same(saved, final[0][role])
    assert not list(run_dir.glob("**/*.tmp-*"))
    with pytest.raises(ValueError, match="2 rank"):  # the rank count is part of the run
        OuterLoop(compose(["experiment=tiny", *OVERRIDES, "resume=true", "schedule.max_updates=0"]), run_dir).run()
