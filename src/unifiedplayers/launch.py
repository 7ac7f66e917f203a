"""torchrun's options for this node of a run, on one node or several: ``python -m unifiedplayers.launch N``.

The launch scripts (``experiments/_common.sh``, ``ablations/sweeps.py``) run ``python -m torch.distributed.run
<options> -m unifiedplayers.train ...`` on every node, with options from ``NNODES`` (1), ``NODE_RANK`` (0 on the
node at ``MASTER_ADDR``, which holds rank 0), ``MASTER_ADDR`` and ``MASTER_PORT`` (29500). One node gets
``--standalone`` (a free port of its own, so two runs on one node never meet); several get a static rendezvous
and no restarts (docs/distributed.md, "Across nodes").
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Sequence

DEFAULT_PORT = 29500


def torchrun_options(nproc_per_node: int, nnodes: int = 1, node_rank: int = 0, master_addr: str = "",
                     master_port: int | str = DEFAULT_PORT, run_id: str = "unifiedplayers") -> list[str]:
    """torchrun's options for one node of a run of ``nnodes`` nodes, ``nproc_per_node`` ranks each."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"{nnodes} node(s) of {nproc_per_node} rank(s): at least one of each")
    if nnodes == 1:
        return ["--standalone", f"--nproc_per_node={nproc_per_node}"]
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"NODE_RANK={node_rank}: 0 .. {nnodes - 1} for NNODES={nnodes}")
    if not master_addr:
        raise ValueError(f"NNODES={nnodes} needs MASTER_ADDR, the address of the node with NODE_RANK=0")
    return [f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--rdzv_backend=static",
            f"--rdzv_endpoint={master_addr}:{master_port}", f"--rdzv_id={run_id}", f"--nproc_per_node={nproc_per_node}"]


def options_from_env(nproc_per_node: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """:func:`torchrun_options` of this node, from ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``."""
    nnodes = int(env.get("NNODES") or 1)
    if nnodes > 1 and not env.get("NODE_RANK"):
        raise ValueError(f"NNODES={nnodes} needs NODE_RANK (0 .. {nnodes - 1}): 0 on the node at MASTER_ADDR")
    return torchrun_options(nproc_per_node, nnodes, int(env.get("NODE_RANK") or 0), env.get("MASTER_ADDR", ""),
                            env.get("MASTER_PORT") or DEFAULT_PORT, env.get("SLURM_JOB_ID") or "unifiedplayers")


def torchrun_command(python: str, nproc_per_node: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """``python -m torch.distributed.run`` of the interpreter ``python`` and its options for this node."""
    return [python, "-m", "torch.distributed.run", *options_from_env(nproc_per_node, env)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print torchrun's options for this node, one a line (the shell reads them with ``mapfile``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m unifiedplayers.launch RANKS_PER_NODE  (reads NNODES, NODE_RANK, MASTER_ADDR, "
              "MASTER_PORT)", file=sys.stderr)
        return 2
    try:
        options = options_from_env(int(args[0]))
    except ValueError as err:
        print(f"unifiedplayers.launch: {err}", file=sys.stderr)
        return 2
    print("\n".join(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
