"""One rank of a data-parallel run on the tiny random model (launched by tests/distributed/test_data_parallel.py
under torchrun): runs or resumes the run, then dumps this rank's weights of the three players."""
from __future__ import annotations

import sys

import torch

from unifiedplayers.config import compose
from unifiedplayers.distributed import destroy, init_distributed
from unifiedplayers.loop.outer import OuterLoop


def run(dist, run_dir: str, dump: str, *overrides: str) -> None:
    """Run or resume the outer loop on this rank of ``dist``; dump this rank's weights of the three players."""
    loop = OuterLoop(compose(["experiment=tiny", *overrides]), run_dir, dist=dist)
    loop.run()
    torch.save({role: {k: v.detach().clone() for k, v in p.model.state_dict().items()}
                for role, p in loop.players.items()}, f"{dump}.rank{dist.rank}.pt")


def main(run_dir: str, dump: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        run(dist, run_dir, dump, *overrides)
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
