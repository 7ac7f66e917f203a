"""The capacity plan of a run over several nodes: host RAM and trainer.offload_dir per node, for that node's ranks;
the run directory shared by the nodes, its checkpoints counted once; the start-up check on every node, naming it."""
from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from unifiedplayers.capacity import GiB, CapacityError, Hardware, check_fits, hardware_here, plan
from unifiedplayers.capacity.hardware import node_ranks_here
from unifiedplayers.capacity.report import format_plan, main
from unifiedplayers.config import compose
from unifiedplayers.distributed import DistContext

QWEN_N = 4_022_468_096
NODE = Hardware()  # the paper's node: 8 x 80 GiB GPUs, 512 GiB of host RAM, 2 TB of disk


def nodes(count: int, gpus: int) -> Hardware:
    return replace(NODE, gpus=gpus, nodes=count)


def host(p):
    """{instant: (total, {item: bytes})} of a plan's host RAM."""
    return {i.name: (i.total, {x.name: x.bytes for x in i.items}) for i in p.host}


def test_per_node_host_ram_counts_only_that_nodes_ranks():
    """Without ZeRO-Offload every item of a node's host RAM belongs to one of its ranks (their processes, the backbone
    each reads at start-up, pi_ref on rank 0): 2 nodes x 4 GPUs plan per node what one node of 4 does, and 2 nodes x 8
    what one node of 8 does, item by item."""
    cfg = compose(["experiment=paper_qwen3_4b", "trainer.offload_optimizer=false"])
    assert host(plan(cfg, nodes(2, 4))) == host(plan(cfg, nodes(1, 4)))
    assert host(plan(cfg, nodes(2, 8))) == host(plan(cfg, nodes(1, 8)))
    two = plan(cfg, nodes(2, 8))
    assert two.world == 16 and two.node_ranks == 8
    assert host(two)["start-up"][1] == {"8 processes: Python, torch, CUDA and vLLM host side, sandbox": 8 * 6 * GiB,
                                        "the backbone read on the host by each rank": 8 * 2 * QWEN_N}


def test_the_zero_offload_state_is_split_over_every_nodes_ranks():
    """ZeRO-Offload's 18N optimizer state is partitioned over all the run's ranks, so a node holds its ranks' share:
    18N x 8 / 16 on each of 2 nodes of 8, against 18N on one node of 8; every other item as one node's."""
    cfg = compose(["experiment=paper_qwen3_4b"])  # the preset: trainer.offload_optimizer=true
    one, two = plan(cfg, nodes(1, 8)), plan(cfg, nodes(2, 8))
    (t1, items1), (t2, items2) = host(one)["update"], host(two)["update"]
    assert items1.pop("active player's ZeRO-Offload state (18N over the ranks)") == 18 * QWEN_N
    assert items2.pop("active player's ZeRO-Offload state (18N over the ranks: this node's 8 of 16)") == 9 * QWEN_N
    assert items1 == items2 and t1 - t2 == 9 * QWEN_N
    assert host(one)["start-up"] == host(two)["start-up"]
    # 2 nodes x 4 GPUs: the same 8 ranks as one node of 8, each node half of them and half of the partitions
    half = plan(cfg, nodes(2, 4))
    assert host(half)["update"][1]["active player's ZeRO-Offload state (18N over the ranks: this node's 4 of 8)"] \
        == 9 * QWEN_N == host(plan(cfg, nodes(1, 4)))["update"][1][
            "active player's ZeRO-Offload state (18N over the ranks)"] / 2


def test_disk_the_run_directory_once_and_each_nodes_parked_state():
    """The checkpoints are written once, to the run directory the nodes share; each node parks its own ranks' idle
    state in its own trainer.offload_dir (DeepSpeed: its ranks' partitions, 54N x 8 / 16 a node). On the run
    directory's file system (no offload disk of its own) every node's parked state adds up there."""
    cfg = compose(["experiment=paper_qwen3_4b"])
    one, two = plan(cfg, NODE), plan(cfg, nodes(2, 8))
    assert two.run_disk == one.run_disk == 176 * QWEN_N  # test_capacity.py works the 176N out by hand
    assert one.parked.bytes == 54 * QWEN_N and two.parked.bytes == 27 * QWEN_N
    assert two.parked.name.endswith(" per node")
    shared = replace(two.machine, disk=176 * QWEN_N + 54 * QWEN_N)
    check_fits(two, shared)  # 176N + 2 nodes x 27N
    with pytest.raises(CapacityError, match=r"disk at the run directory.*x 2 nodes"):
        check_fits(two, replace(shared, disk=shared.disk - 1))
    local = replace(two.machine, disk=176 * QWEN_N, offload_disk=27 * QWEN_N)  # a node's own disk for its parked state
    check_fits(two, local)
    with pytest.raises(CapacityError, match="disk in trainer.offload_dir") as refused:
        check_fits(two, replace(local, offload_disk=27 * QWEN_N - 1))
    assert "disk at the run directory" not in str(refused.value)


def test_the_torch_backend_parks_each_ranks_whole_optimizer_state():
    """trainer=torch keeps a whole AdamW state (and float32 masters beside bf16 weights) on every rank: a node parks
    as many as it has ranks."""
    cfg = compose(["experiment=paper_qwen3_4b", "trainer=torch"])
    per_rank = 8 * QWEN_N + 4 * QWEN_N  # AdamW 8N, masters 4N
    for gpus, count in ((1, 1), (2, 1), (4, 2)):
        p = plan(cfg, nodes(count, gpus))
        ref = gpus * 2 * QWEN_N  # pi_ref on each rank of the node (ref_mode precompute, not ZeRO-3)
        assert p.parked.bytes == max(3 * gpus * per_rank, 2 * (gpus * per_rank + ref))


def test_the_printed_plan_says_per_node(capsys):
    text = format_plan(plan(compose(["experiment=paper_qwen3_4b"]), nodes(2, 8)))
    assert "16 ranks, 8 on each of 2 nodes (torchrun --nnodes=2 --nproc_per_node=8)" in text
    assert "Host RAM per node (node 0's 8 ranks), GiB" in text and "Peak host RAM per node:" in text
    assert "the run directory, shared by the 2 nodes, with every node's parked state there" in text
    assert "2 nodes of 8 ranks, alike" in text
    assert main(["experiment=paper_qwen3_4b", "--nodes", "2", "--offload-disk-tb", "1"]) == 0
    out = capsys.readouterr().out
    assert "Hardware: 2 nodes of 8 x 80 GiB GPU and 512 GiB RAM each, 2 TB disk shared, 1 TB in trainer.offload_dir" \
        in out and "each node's trainer.offload_dir: 108.61 GB, of 1.00 TB" in out


def test_hardware_here_is_this_node_of_the_run(monkeypatch, tmp_path):
    """torchrun's LOCAL_WORLD_SIZE says how many of the WORLD_SIZE ranks are on this node; the node is named by its
    host name."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    machine = hardware_here(compose(["experiment=tiny"]), 8, str(tmp_path))
    assert (machine.cpu_ranks, machine.gpus, machine.nodes) == (4, 4, 2)
    assert machine.name.startswith(f"node {socket.gethostname()}: 4 of 8 ranks (2 nodes)")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_ranks_here(8) == 8 and hardware_here(compose(["experiment=tiny"]), 8, str(tmp_path)).nodes == 1


def test_the_start_up_check_refuses_on_a_node_without_room_naming_it(monkeypatch, tmp_path):
    """Every rank checks the node it is on, for that node's ranks only: a node with room for its 2 ranks starts
    although the run's 8 would not fit one node; a node short of RAM for its ranks refuses, with its figures and
    its host name."""
    from unifiedplayers.capacity import hardware
    from unifiedplayers.checks import check_capacity

    cfg = compose(["experiment=tiny", f"run_dir={tmp_path}"])
    per_node = plan(cfg, Hardware(gpu_memory=0, cpu_ranks=2, nodes=4)).host_peak.total
    assert plan(cfg, Hardware(gpu_memory=0, cpu_ranks=8)).host_peak.total > per_node + 1 * GiB
    monkeypatch.setattr(hardware, "_rss", lambda: 0.0)
    monkeypatch.setattr(hardware, "_meminfo", lambda key: per_node + 1 * GiB)  # room for 2 ranks, not for 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rank = DistContext(rank=6, world_size=8, local_rank=0)
    check_capacity(cfg, rank)
    monkeypatch.setattr(hardware, "_meminfo", lambda key: per_node - 1 * GiB)
    with pytest.raises(CapacityError) as refused:
        check_capacity(cfg, DistContext(rank=7, world_size=8, local_rank=1))
    message = str(refused.value)
    assert f"node {socket.gethostname()}: 2 of 8 ranks (4 nodes)" in message
    assert "host RAM per node" in message and f"> {(per_node - GiB) / GiB:.1f} GiB available" in message
