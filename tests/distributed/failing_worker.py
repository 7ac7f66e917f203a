"""A rank of dp_worker.py's run on the tiny random model whose rank ``FAIL_RANK`` raises when it starts sampling
after ``FAIL_AFTER`` updates are in the run's metrics (mid-run, between two saves; launched by
tests/distributed/test_rank_failure.py under torchrun). Without ``FAIL_RANK`` it is dp_worker.py."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from unifiedplayers.distributed import DistContext, destroy, init_distributed
from tests.distributed.dp_worker import run  # noqa: E402


def plant(run_dir: Path, rank: int, after: int) -> None:
    """Rank ``rank`` raises at its first generation call once ``after`` updates are in ``run_dir``'s metrics."""
    split_prompts = DistContext.split_prompts

    def failing(self, generate, num_prompts, to_all=True):
        metrics = run_dir / "metrics.jsonl"
        if self.rank == rank and metrics.exists() and metrics.read_bytes().count(b"\n") >= after:
            (run_dir.parent / "raised").write_text(str(time.time()))
            raise RuntimeError(f"planted failure on rank {rank} after {after} updates")
        return split_prompts(self, generate, num_prompts, to_all)

    DistContext.split_prompts = failing


def main(run_dir: str, dump: str, *overrides: str) -> None:
    dist = init_distributed()
    if "FAIL_RANK" in os.environ:
        plant(Path(run_dir), int(os.environ["FAIL_RANK"]), int(os.environ["FAIL_AFTER"]))
    try:
        run(dist, run_dir, dump, *overrides)
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
