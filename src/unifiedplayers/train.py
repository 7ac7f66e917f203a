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

import gc
import os
import sys

# Idle OpenMP threads sleep instead of spinning, unless the caller chose a policy (read once, when torch loads its
# OpenMP runtime, so only where torch is not yet imported): spinning threads beside a busy core slow an update down
# far more than sleeping ones cost on an idle machine (benchmarks/README.md, "Threads").
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from unifiedplayers.config import CONF_DIR, register_configs  # noqa: E402

register_configs()


def run(cfg: DictConfig, run_dir: str | None = None, dist=None) -> dict:
    """Run (or resume) the outer loop of ``cfg`` in ``run_dir`` (default: cfg.run_dir) as rank ``dist``."""
    import torch

    from unifiedplayers.distributed import SINGLE
    from unifiedplayers.loop.outer import OuterLoop

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    target = run_dir or cfg.run_dir
    if not target:
        raise ValueError("no run directory: set run_dir")
    return OuterLoop(cfg, target, dist=dist or SINGLE).run()


def refuse_paper_schedule_on_cpu(task_overrides: list[str]) -> None:
    """A bare ``python -m unifiedplayers.train`` is the paper's schedule (2,100 updates of a 4B model): on a
    machine without a GPU it stops at once, naming the presets. An explicit ``experiment=...`` always runs."""
    import torch

    if any(o.split("=", 1)[0].lstrip("+") == "experiment" for o in task_overrides) or torch.cuda.is_available():
        return
    raise SystemExit(
        "unifiedplayers.train: no experiment= given, and this machine has no GPU: the default is the paper's "
        "schedule (2,100 updates). On a CPU run `python -m unifiedplayers.train experiment=smoke` (what `make run` "
        "runs) or experiment=tiny; the paper presets are experiment=paper_qwen3_4b and experiment=paper_mimo_7b "
        "(GPUs). `--help` lists the common keys.")


def default_run_notice(task_overrides: list[str], cfg: DictConfig) -> str | None:
    """The line a bare run (no ``experiment=``, on a GPU machine) prints first: the defaults are not a paper preset."""
    if any(o.split("=", 1)[0].lstrip("+") == "experiment" for o in task_overrides):
        return None
    s = cfg.schedule
    updates = s.outer_iterations * (s.planning_updates + s.execution_updates + s.evaluation_updates)
    return (f"[train] no experiment= given: the defaults of conf/config.yaml, {cfg.model.name} on {cfg.model.device}, "
            f"{updates:,} updates ({s.outer_iterations} x {s.planning_updates}/{s.execution_updates}/"
            f"{s.evaluation_updates}); not a paper preset. The paper's runs: experiment=paper_qwen3_4b or "
            "experiment=paper_mimo_7b (torchrun --nproc_per_node=8); a short run: experiment=smoke")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from unifiedplayers.distributed import check_shared_directory, destroy, init_distributed

    refuse_paper_schedule_on_cpu(list(HydraConfig.get().overrides.task))
    notice = default_run_notice(list(HydraConfig.get().overrides.task), cfg)
    if notice and os.environ.get("RANK", "0") == "0":
        print(notice, flush=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist = init_distributed()  # one process (no-op) unless a launcher set WORLD_SIZE > 1
    try:
        # Every rank works in rank 0's directory (Hydra's timestamped default can differ between ranks).
        run_dir = dist.broadcast(cfg.run_dir or HydraConfig.get().runtime.output_dir)
        check_shared_directory(dist, run_dir)  # one filesystem on every node, or a stop naming the node
        # What the imports made lives as long as the process: out of the collector's sight, a full collection
        # (DeepSpeed runs one in every offload_states() of an idle player) walks only what the run makes
        # (benchmarks/README.md, "Collections after start-up").
        gc.freeze()
        run(cfg, run_dir, dist)
    finally:
        destroy(dist)


def preflight(overrides: list[str]) -> None:
    """What must fail before Hydra writes into the run directory: a misspelled key, the paper schedule on a CPU, a GPU
    that torch cannot use, and a run directory whose run this config cannot continue."""
    from pathlib import Path

    from unifiedplayers.config import check_override_keys, compose
    from unifiedplayers.loop.run_state import saved_state
    from unifiedplayers.machine import check_gpu_usable

    check_override_keys(overrides)
    refuse_paper_schedule_on_cpu(overrides)
    try:  # hydra.searchpath (a config group outside the package) must reach the composition
        cfg = compose([o for o in overrides
                       if not o.lstrip("+~").startswith("hydra") or o.startswith("hydra.searchpath")])
    except ValueError:
        raise
    except Exception:  # noqa: BLE001 - a composition error: Hydra reports it in its own words next
        return
    check_gpu_usable(str(cfg.model.device))
    if cfg.run_dir:
        saved_state(Path(cfg.run_dir), cfg, int(os.environ.get("WORLD_SIZE", "1")), restart=False)


def cli() -> None:
    """``preflight``, then the Hydra app (Hydra's own modes, ``--help``, ``--cfg``, ``-m``, go straight to it)."""
    args = sys.argv[1:]
    if not any(a.startswith("-") for a in args):
        try:
            preflight(args)
        except (ValueError, FileExistsError, RuntimeError) as err:
            sys.exit(f"unifiedplayers.train: {err}")
    main()


if __name__ == "__main__":
    sys.exit(cli())
