"""The machine a plan is checked against: :class:`Hardware` (the paper's node by default), and :func:`hardware_here`,
this process's node."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from unifiedplayers.capacity.units import GB, TB, GiB
from unifiedplayers.rundir import CHECKPOINTS


@dataclass(frozen=True)
class Hardware:
    """What a plan is checked against and timed on; the defaults are the paper's node, 8 × A100 80GB (Appendix H.2).
    Bytes throughout. ``nodes`` are alike, each with its own host RAM and ``trainer.offload_dir``; the run directory
    is one file system they share."""

    gpus: int = 8  # GPUs of a node, one rank each (torchrun --nproc_per_node)
    gpu_memory: float = 80 * GiB  # per GPU; 0: no GPU (a GPU plan is then not checked)
    host_ram: float = 512 * GiB  # per node
    disk: float = 2 * TB  # free where the run directory lies (shared by the nodes)
    offload_disk: Optional[float] = None  # free in trainer.offload_dir when another file system (a node's own)
    cpu_ranks: int = 1  # processes of a CPU run, per node
    nodes: int = 1  # nodes of the run (torchrun --nnodes), each with gpus GPUs (or cpu_ranks processes)
    gpu_flops: float = 312e12  # dense bf16 matmul peak per GPU (A100)
    gpu_bandwidth: float = 2.039e12  # HBM bytes a second per GPU (A100 80GB SXM)
    utilisation: float = 0.35  # MFU of the compute-bound passes (training, prefill, no-grad passes)
    decode_efficiency: float = 0.6  # share of gpu_bandwidth that decoding reaches (it reads weights and KV each step)
    bf16: Optional[bool] = None  # whether dtype auto resolves to bfloat16 here; None: on a GPU yes, on a CPU no
    name: str = "8 x A100 80GB, 512 GiB RAM, 2 TB disk (the paper's node)"


def hardware_here(cfg: Any, world: int, run_dir: Optional[str] = None) -> Hardware:
    """The node this process runs on: its GPU (none: no GPU check), the host RAM available (plus what this node's
    ranks already hold), the free disk at the run directory (plus a resumed run's checkpoints) and in
    trainer.offload_dir."""
    import torch

    from unifiedplayers.precision import native_bf16

    gpu, name = 0.0, "no GPU"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, name = float(props.total_memory), props.name
    local = node_ranks_here(world)
    nodes = max(1, world // local)
    ram = _meminfo("MemAvailable") + _rss() * local
    run = Path(run_dir or os.getcwd()).expanduser().resolve()
    disk = _free(run) + _bytes_under(run / CHECKPOINTS)
    offload = Path(cfg.trainer.offload_dir or tempfile.gettempdir()).expanduser().resolve()
    other = _device(offload) != _device(run)
    ranks = f"{world} rank(s)" if nodes == 1 else f"{local} of {world} ranks ({nodes} nodes)"
    return Hardware(gpus=local, gpu_memory=gpu, host_ram=ram, disk=disk, offload_disk=_free(offload) if other else None,
                   cpu_ranks=local, nodes=nodes, bf16=native_bf16(str(cfg.model.device))[0],
                   name=f"node {socket.gethostname()}: {ranks}, {name}, {ram / GiB:.0f} GiB RAM available, "
                        f"{disk / GB:.0f} GB free at {run}")


def node_here(cfgs: Sequence[Any]) -> Hardware:
    """This node for runs started together, one GPU each: :func:`hardware_here` of the first run, every run's
    checkpoints counted as free disk; the runs' directories on one file system."""
    first = hardware_here(cfgs[0], 1, cfgs[0].get("run_dir"))
    dirs = [Path(c.run_dir or os.getcwd()).expanduser().resolve() for c in cfgs]
    disk = first.disk + sum(_bytes_under(d / CHECKPOINTS) for d in dirs[1:])
    return replace(first, disk=disk, name=f"node {socket.gethostname()}: {first.host_ram / GiB:.0f} GiB RAM available, "
                                          f"{disk / GB:.0f} GB free at {os.path.commonpath(dirs)}")


def node_ranks_here(world: int) -> int:
    """The ranks of a ``world``-rank run on this node: ``LOCAL_WORLD_SIZE`` (torchrun), else all of them."""
    return min(world, max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or world)))


def _meminfo(key: str) -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _rss() -> float:
    try:
        return float(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0.0


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free(path: Path) -> float:
    return float(shutil.disk_usage(_existing(path)).free)


def _device(path: Path) -> int:
    return _existing(path).stat().st_dev


def _bytes_under(path: Path) -> float:
    if not path.is_dir():
        return 0.0
    return float(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))
