"""``python -m unifiedplayers.train [overrides]``: train UnifiedPlayers end to end (Hydra over conf/config.yaml).

The run directory is ``run_dir`` when set, else Hydra's output directory. ``resume=true`` continues the
run found there (a fresh run when there is none); without it an existing run is an error, never
overwritten. Examples::

    python -m unifiedplayers.train experiment=smoke              # what `make run` runs (runs/smoke, resumable)
    python -m unifiedplayers.train experiment=paper_qwen3_4b schedule.feedback=stale
    python -m unifiedplayers.train experiment=smoke run_dir=runs/smoke2 resume=false
"""
from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from unifiedplayers.config import CONF_DIR, register_configs

register_configs()


def run(cfg: DictConfig, run_dir: str | None = None) -> dict:
    """Run (or resume) the outer loop of ``cfg`` in ``run_dir`` (default: cfg.run_dir)."""
    import torch

    from unifiedplayers.schedule import OuterLoop

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    target = run_dir or cfg.run_dir
    if not target:
        raise ValueError("no run directory: set run_dir")
    return OuterLoop(cfg, target).run()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    run(cfg, run_dir)


if __name__ == "__main__":
    sys.exit(main())
