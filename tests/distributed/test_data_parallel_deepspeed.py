"""DeepSpeed ZeRO-2 / ZeRO-3 over two data-parallel ranks (gloo, CPU), launched with torchrun as a
subprocess (tests/distributed/ds_worker.py).

- trainer level: both ranks end with identical weights, equal to the single-process step on the same
  batches (the engine averages gradients over the ranks; our losses are scaled so that the step is the
  batch's, whatever the rank count), although rank 1 runs one micro-batch of three plus a zero-weight pad;
  a collective checkpoint (one optimizer partition per rank) round-trips bit-exactly; recomputed π_old
  log-probs (each rank its micro-batches, the same pad) are the single process's, on both ranks.
- outer loop: ZeRO-2 with hf rollouts writes records, metrics and checkpoints once, keeps the ranks equal
  and resumes; the paper presets rehearsed (tests/distributed/paper_rehearsal.py: ZeRO-3 with ZeRO-Offload,
  ref_mode precompute, gradient checkpointing, S = 4, a cadence save) with a weight-copying engine per rank (what
  vLLM does) gathers the partitions collectively for every copy, recomputes π_old at each phase's start on both
  ranks, and offloads an idle player's DeepSpeed state as on a GPU.
- host memory: under ZeRO-3 with ``ref_mode: precompute`` only rank 0 keeps π_ref; rank 1's KL
  terms are still the single process's (tests/trainer/test_idle_player_memory.py tests one process).
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("deepspeed")

from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.distributed import DistContext  # noqa: E402
from unifiedplayers.diagnostics.logging import read_metrics  # noqa: E402
from unifiedplayers.diagnostics.records import load_records  # noqa: E402
from unifiedplayers.loop.outer import OuterLoop  # noqa: E402
from unifiedplayers.trainer import build_trainer  # noqa: E402
from unifiedplayers.trainer.deepspeed_backend import DEFAULT_EXTENSIONS_DIR  # noqa: E402
from tests.distributed.launch import same  # noqa: E402
from tests.distributed.launch import torchrun as torchrun_worker  # noqa: E402
from tests.distributed.paper_rehearsal import rehearsal_overrides  # noqa: E402
from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("ds_worker.py")
# The outer loop as in test_data_parallel.py: micro-batches of one sample, a second Planning update whose
# KL gradient differs between the ranks' micro-batches.
LOOP = ["trainer.micro_batch_size=1", "schedule.planning_updates=2"]


def torchrun(*jobs: list[str]) -> None:
    """One two-rank launch of the worker running ``jobs`` in order (each rank, DeepSpeed and the process group
    start once for all of them). The time limit grows with the jobs: 300 s each. The first launch (three jobs)
    took 288 s with the suite's other worker and two trainings beside it on 2 cores."""
    args = [a for job in jobs for a in ["--", *job]][1:]
    torchrun_worker(WORKER, *args, env={"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                                              str(DEFAULT_EXTENSIONS_DIR))},
                    timeout=300 * len(jobs))


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Two launches serve the four two-rank tests: the first runs the trainer-level steps, the reference's ranks, the
    ZeRO-2 outer loop up to its stop after the Planning block and the paper rehearsal (a ZeRO-3 outer loop); the
    second resumes the ZeRO-2 run in a fresh job (a resume is a new launch). Each job has its own directory."""
    root = tmp_path_factory.mktemp("ds")
    d = {name: root / name for name in ("trainer", "zero2", "paper", "reference")}
    for path in d.values():
        path.mkdir()
    zero2 = ["loop", str(d["zero2"] / "run"), str(d["zero2"] / "weights"), *LOOP, "trainer=deepspeed_zero2"]
    torchrun(["trainer", str(d["trainer"] / "trainer")],
             ["reference", str(d["reference"] / "dump")],
             zero2 + ["schedule.max_updates=2"],
             ["paper", str(d["paper"] / "run"), str(d["paper"] / "weights"), *rehearsal_overrides()[1:],
              "rollout.backend=vllm"])
    zero2_first = ranks(d["zero2"] / "weights")
    zero2_first_metrics = read_metrics(d["zero2"] / "run")
    torchrun(zero2 + ["resume=true"])
    return SimpleNamespace(dirs=d, zero2_first=zero2_first, zero2_first_metrics=zero2_first_metrics)


def ranks(dump: Path) -> list[dict]:
    return [torch.load(f"{dump}.rank{r}.pt", weights_only=False) for r in (0, 1)]


def single_process_run():
    """The torch trainer in this process on the worker's batches: metrics and weights after each step, and the
    first batch's π_old recomputed at the start."""
    from tests.distributed.ds_worker import STEPS, batches

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = tiny_model()
        trainer = build_trainer(trainer_config(kl_coef=0.05), model)
        trainer.start_outer_iteration()
        data = batches(STEPS)
        redone = copy.deepcopy(data[0])
        trainer.recompute_old_logprobs(redone)
        metrics = [trainer.update(b) for b in data]
        return metrics, trainer.full_state_dict(), [s.old_logprobs for s in redone]
    finally:
        torch.set_num_threads(before)


def test_zero_stages_over_two_ranks_take_the_single_process_step(launches):
    tmp_path = launches.dirs["trainer"]
    out = ranks(tmp_path / "trainer")
    metrics, weights, old_logprobs = single_process_run()
    initial = tiny_model()[0].state_dict()
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 1e-4  # training moved them
    for backend in ("deepspeed_zero2", "deepspeed_zero3"):
        r0, r1 = out[0][backend], out[1][backend]
        assert same(r0["steps"], r1["steps"]) and same(r0["after"], r1["after"]), backend
        for ours, single in zip(r0["metrics"], metrics):
            assert ours["actor/num_micro_batches"] == single["actor/num_micro_batches"] == 3
            assert ours["actor/num_tokens"] == single["actor/num_tokens"]  # the pad adds no tokens
            assert ours["actor/loss"] == pytest.approx(single["actor/loss"], abs=1e-6)
            # The gradient of the whole batch, not the ranks' average of their shares.
            assert ours["actor/grad_norm"] == pytest.approx(single["actor/grad_norm"], rel=1e-5), backend
        assert r0["metrics"][-1]["actor/kl"] > 0
        # π_old's forward: each rank its micro-batches of rows 0-2 | 3-5 | 6-7, rank 1 a pad of three rows
        assert (r0["recompute_forwards"], r1["recompute_forwards"]) == ([3, 2], [3, 3]), backend
        assert all(torch.equal(a, b) for a, b in zip(r0["old_logprobs"], r1["old_logprobs"]))  # every rank has all
        for ours, single in zip(r0["old_logprobs"], old_logprobs):
            torch.testing.assert_close(ours, single, atol=1e-5, rtol=0)
        for k, v in weights.items():
            torch.testing.assert_close(r0["steps"][k], v, atol=1e-5, rtol=0, msg=lambda m: f"{backend} {k}: {m}")
        for r in out:  # save, step, load, step: the same step again, on both ranks
            assert same(r[backend]["again"], r[backend]["after"]), backend
        state = tmp_path / f"ckpt-{backend}" / "deepspeed" / "state"
        assert sorted(p.name for p in state.glob("*optim_states.pt")) == [  # each rank wrote its partition
            "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert not list(tmp_path.glob("**/.*.tmp-*"))


def test_under_zero3_only_rank_0_keeps_the_reference(launches):
    from tests.distributed.ds_worker import REFERENCE_STEPS, batches

    ranks_out = [torch.load(launches.dirs["reference"] / f"dump.rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["holds_reference"] for r in ranks_out] == [True, False]
    assert all(r["has_reference"] for r in ranks_out)
    assert same(ranks_out[0]["weights"], ranks_out[1]["weights"])

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = build_trainer(trainer_config(kl_coef=0.1), tiny_model()[0])  # one process, the torch backend
        single.start_outer_iteration()
        kls = [single.update(b)["actor/kl"] for b in batches(REFERENCE_STEPS)]
    finally:
        torch.set_num_threads(before)
    assert kls[-1] > 0
    assert ranks_out[0]["kl"] == pytest.approx(kls, rel=1e-4, abs=1e-9)  # every rank's tokens saw π_ref


def test_zero2_outer_loop_over_two_ranks_writes_once_and_resumes(launches):
    run_dir, dump = launches.dirs["zero2"] / "run", launches.dirs["zero2"] / "weights"
    first = launches.zero2_first  # stopped after the Planning block, then resumed by a second launch
    assert len(launches.zero2_first_metrics) == 2
    final = ranks(dump)
    for role in ("planning", "execution", "evaluation"):
        assert same(first[0][role], first[1][role]) and same(final[0][role], final[1][role]), role
    assert not same(first[0]["planning"], first[0]["evaluation"])  # the trained players moved
    assert not same(first[0]["evaluation"], final[0]["evaluation"])
    metrics = read_metrics(run_dir)
    assert [(m["block"], m["update"]) for m in metrics] == [
        ("planning", 0), ("planning", 1), ("execution", 0), ("evaluation", 0)]
    assert metrics[1]["planning/grad_norm"] > 0
    ids = [r.task_id for r in load_records(run_dir / "records.jsonl")]
    assert len(ids) == len(set(ids)) == torch.load(run_dir / "state.pt", weights_only=False)["records"]
    for role in ("planning", "execution", "evaluation"):
        state = run_dir / "checkpoints" / "iter1" / role / "deepspeed" / "state"
        assert len(list(state.glob("zero_pp_rank_*_optim_states.pt"))) == 2, role  # one partition per rank
    assert not list(run_dir.glob("**/.*.tmp-*"))


def test_the_paper_rehearsal_over_two_ranks(launches):
    """The paper presets' trainer and schedule settings (tests/distributed/paper_rehearsal.py) on two ranks, each with
    its engine (rollout=vllm: ds_worker.CopyingEngine): 8 Planning updates in two phases of S = 4, then 4 Execution
    and 4 Evaluation updates, whose batches of 2 tasks give each rank a micro-batch."""
    run_dir, dump = launches.dirs["paper"] / "run", launches.dirs["paper"] / "weights"
    out = ranks(dump)
    assert [r["engines"] for r in out] == [["__main__.CopyingEngine"]] * 2  # vLLM's own: test_paper_rehearsal_vllm.py
    final = [r["weights"] for r in out]
    for role in ("planning", "execution", "evaluation"):
        assert same(final[0][role], final[1][role]), role
    assert not same(final[0]["planning"], final[0]["evaluation"])
    assert not same(final[0]["execution"], final[0]["evaluation"])
    cfg = OmegaConf.load(run_dir / "config.yaml")
    t = cfg.trainer
    assert t.offload_optimizer and t.gradient_checkpointing and t.recompute_old_logprobs  # refused on 2 ranks before
    assert (t.backend, t.ref_mode, cfg.rollout.backend) == ("deepspeed_zero3", "precompute", "vllm")
    assert all(all(r["activation_checkpointing"].values()) for r in out)
    metrics = read_metrics(run_dir)
    assert [(m["block"], m["update"]) for m in metrics] == [
        *(("planning", u) for u in range(8)), *(("execution", u) for u in range(4)),
        *(("evaluation", u) for u in range(4))]
    assert all(m[f"{m['block']}/skipped"] == 0.0 for m in metrics)
    # π_old recomputed at every phase's start, against the behaviour log-probs of an engine synced after every step
    assert all(0.0 <= m[f"{m['block']}/logprob_mismatch"] < 1e-4 for m in metrics)
    assert all(m[f"{m['block']}/num_micro_batches"] == 2 for m in metrics[8:])  # one per rank
    assert metrics[11]["execution/pool_step"] == 4  # each rank answered its half of the pool; rank 0 logged it
    # What an idle player's engine moves off a GPU (here: called as on a GPU): under ZeRO-Offload ZeRO-3 keeps all
    # but its contiguous gradient buffer on the host. All three players go idle, and the Execution and Evaluation
    # players (idle during the Planning block) come back for their first step; both ranks alike (collectives).
    calls = out[0]["offload_calls"]
    assert calls == out[1]["offload_calls"]
    assert {c for c in calls if c[0] == "offload"} == {("offload", ("contiguous_grad_buffer",))}
    assert calls.count(("offload", ("contiguous_grad_buffer",))) >= 3 and calls.count(("reload", ())) >= 2
    for role in ("planning", "execution", "evaluation"):  # each rank its partition of DeepSpeed's CPU Adam state
        state = run_dir / "checkpoints" / "iter1" / role / "deepspeed" / "state"
        assert len(list(state.glob("zero_pp_rank_*_optim_states.pt"))) == 2, role


def test_several_ranks_refuse_what_they_cannot_do(tmp_path):
    two = DistContext(rank=0, world_size=2)
    with pytest.raises(NotImplementedError, match="rollout=vllm"):
        OuterLoop(compose(["experiment=tiny", "trainer=deepspeed_zero3"]), tmp_path, dist=two)
    with pytest.raises(NotImplementedError, match="feedback=stale"):
        OuterLoop(compose(["experiment=tiny", "trainer=deepspeed_zero3", "rollout=vllm", "schedule.feedback=stale"]),
                  tmp_path, dist=two)
    with pytest.raises(NotImplementedError, match="tensor_parallel_size=1"):
        OuterLoop(compose(["experiment=tiny", "rollout=vllm", "rollout.tensor_parallel_size=2"]), tmp_path, dist=two)
    OuterLoop(compose(["experiment=tiny", "trainer=deepspeed_zero2", "rollout=vllm"]), tmp_path, dist=two)
