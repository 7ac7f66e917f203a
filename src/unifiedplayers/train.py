"""``python -m unifiedplayers.train [overrides]``: train UnifiedPlayers end to end (Hydra over conf/config.yaml).

The run directory is ``run_dir`` when set, else Hydra's output directory. ``resume=true`` continues the
run found there (a fresh run when there is none); without it an existing run is an error, never
overwritten. Examples::

    python -m unifiedplayers.train experiment=smoke              # what `make run` runs (runs/smoke, resumable)
    python -m unifiedplayers.train experiment=paper_qwen3_4b schedule.feedback=stale
    python -m unifiedplayers.train experiment=smoke run_dir=runs/smoke2 resume=false

One run over N GPUs (data-parallel ranks in lockstep, rank 0 writes the run; :mod:`unifiedplayers.distributed`)::

    torchrun --nproc_per_node=8 -m unifiedplayers.train experiment=paper_qwen3_4b run_dir=runs/qwen3_4b/dp8
"""
from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from unifiedplayers.config import CONF_DIR, register_configs

register_configs()


def run(cfg: DictConfig, run_dir: str | None = None, dist=None) -> dict:
    """Run (or resume) the outer loop of ``cfg`` in ``run_dir`` (default: cfg.run_dir); ``dist``: this
    process's rank (default: one process)."""
    import torch

    from unifiedplayers.distributed import SINGLE
    from unifiedplayers.loop import OuterLoop

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    target = run_dir or cfg.run_dir
    if not target:
        raise ValueError("no run directory: set run_dir")
    return OuterLoop(cfg, target, dist=dist or SINGLE).run()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from unifiedplayers.distributed import destroy, init_distributed

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist = init_distributed()  # one process (no-op) unless a launcher set WORLD_SIZE > 1
    try:
        # Every rank works in rank 0's directory (Hydra's timestamped default can differ between ranks).
        run_dir = dist.broadcast(cfg.run_dir or HydraConfig.get().runtime.output_dir)
        run(cfg, run_dir, dist)
    finally:
        destroy(dist)


if __name__ == "__main__":
    sys.exit(main())
