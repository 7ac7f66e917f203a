"""One rank of tests/distributed/test_shared_directory.py (torchrun, two gloo ranks): the shared-filesystem check of
the run directory, first with both ranks in ``shared``, then with rank 1 in ``elsewhere`` (a node whose directory at
that path is its own). Each rank writes what each check said to ``<out>.rank<r>.json``."""
from __future__ import annotations

import json
import sys

from unifiedplayers.distributed import check_shared_directory, destroy, init_distributed


def main(shared: str, elsewhere: str, out: str) -> None:
    dist = init_distributed(backend="gloo")
    said = []
    try:
        for directory in (shared, elsewhere if dist.rank == 1 else shared):
            try:
                check_shared_directory(dist, directory, wait_s=1.0)
                said.append("ok")
            except RuntimeError as err:
                said.append(str(err))
    finally:
        destroy(dist)
    with open(f"{out}.rank{dist.rank}.json", "w") as f:
        json.dump(said, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
