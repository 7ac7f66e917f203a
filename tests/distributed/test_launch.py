"""torchrun's options for a node of a run (src/unifiedplayers/launch.py), and the launch scripts that use them
(``launch_ranks`` of experiments/_common.sh): ``--standalone`` on one node, the static rendezvous of ``NNODES``,
``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` on several, torchrun as ``$PY -m torch.distributed.run`` whatever
``PY`` is named; the sandbox of a rank sized by the ranks of its own node. The run over two nodes itself:
test_two_nodes.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from unifiedplayers.distributed import DistContext, ranks_on_this_node, sandbox_config
from unifiedplayers.launch import options_from_env, torchrun_command, torchrun_options
from tests.distributed.launch import SRC  # noqa: E402

pytestmark = [pytest.mark.cpu]

REPO = Path(__file__).parents[2]


def test_one_node_is_standalone():
    assert torchrun_options(8) == ["--standalone", "--nproc_per_node=8"]
    assert options_from_env(8, {}) == options_from_env(8, {"NNODES": "1", "MASTER_ADDR": "x"}) == \
        ["--standalone", "--nproc_per_node=8"]


def test_several_nodes_meet_at_node_0():
    assert torchrun_options(8, 2, 1, "node-a", 29501, "job7") == [
        "--nnodes=2", "--node_rank=1", "--rdzv_backend=static", "--rdzv_endpoint=node-a:29501", "--rdzv_id=job7",
        "--nproc_per_node=8"]
    env = {"NNODES": "4", "NODE_RANK": "3", "MASTER_ADDR": "10.0.0.1"}
    assert options_from_env(2, env) == [
        "--nnodes=4", "--node_rank=3", "--rdzv_backend=static", "--rdzv_endpoint=10.0.0.1:29500",
        "--rdzv_id=unifiedplayers", "--nproc_per_node=2"]
    assert "--rdzv_id=123" in options_from_env(2, {**env, "SLURM_JOB_ID": "123"})  # one id for the job's nodes
    for python in ("python3", "/opt/conda/bin/python3.11", "python"):
        assert torchrun_command(python, 2, env)[:3] == [python, "-m", "torch.distributed.run"]


@pytest.mark.parametrize("env, error", [
    ({"NNODES": "2", "MASTER_ADDR": "a"}, "NNODES=2 needs NODE_RANK"),
    ({"NNODES": "2", "NODE_RANK": "1"}, "NNODES=2 needs MASTER_ADDR"),
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "a"}, r"NODE_RANK=2: 0 \.\. 1"),
])
def test_a_node_without_its_place_is_refused(env, error):
    with pytest.raises(ValueError, match=error):
        options_from_env(8, env)


def paper_run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """experiments/qwen3_4b.sh with ``PY`` a stand-in named ``python3`` that records torchrun's arguments (and runs
    everything else with this interpreter)."""
    calls, model, run_dir = tmp_path / "torchrun_calls", tmp_path / "Qwen3-4B-Base", tmp_path / "run"
    model.mkdir(exist_ok=True)
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m torch.distributed.run" ]; then shift 2; printf '%s\\n' "$@" > {calls}; exit 0; fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    full = {**os.environ, "PYTHONPATH": SRC, "PY": str(fake), "MODEL_PATH": str(model), "RUN_DIR": str(run_dir),
            **env}
    for key in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full.setdefault(key, "")
    proc = subprocess.run(["bash", str(REPO / "experiments" / "qwen3_4b.sh"), "seed=3"], env=full,
                          capture_output=True, text=True, timeout=120)
    return proc, calls


def test_the_launch_script_runs_torchrun_of_py_on_one_node_or_several(tmp_path):
    proc, calls = paper_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = calls.read_text().splitlines()
    assert args[:4] == ["--standalone", "--nproc_per_node=8", "-m", "unifiedplayers.train"], args
    assert f"run_dir={tmp_path / 'run'}" in args and args[-1] == "seed=3"

    proc, calls = paper_run(tmp_path, NNODES="2", NODE_RANK="1", MASTER_ADDR="node-a", MASTER_PORT="29511", NGPU="4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert calls.read_text().splitlines()[:8] == [
        "--nnodes=2", "--node_rank=1", "--rdzv_backend=static", "--rdzv_endpoint=node-a:29511",
        "--rdzv_id=unifiedplayers", "--nproc_per_node=4", "-m", "unifiedplayers.train"]
    assert (tmp_path / "run" / "launch.node1.log").exists()  # each node but node 0 logs apart

    calls.unlink()
    proc, calls = paper_run(tmp_path, NNODES="2", MASTER_ADDR="node-a")
    assert proc.returncode != 0 and not calls.exists()
    assert "NNODES=2 needs NODE_RANK" in (tmp_path / "run" / "launch.log").read_text()


def test_the_sandbox_shares_the_cores_of_its_own_node_among_that_nodes_ranks():
    job = DistContext(rank=9, world_size=16, local_rank=1)  # node 1 of 2, 8 ranks each
    cores = os.cpu_count() or 1
    one_per_core = OmegaConf.create({"workers": 0})
    assert ranks_on_this_node(job, {"LOCAL_WORLD_SIZE": "8"}) == 8
    assert sandbox_config(one_per_core, job, {"LOCAL_WORLD_SIZE": "8"}).workers == max(2, 2 * cores // 8)
    assert ranks_on_this_node(job, {}) == 16  # another launcher: as if the whole job were on this node
    assert sandbox_config(OmegaConf.create({"workers": 3}), job, {"LOCAL_WORLD_SIZE": "8"}).workers == 3
