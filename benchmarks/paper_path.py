"""Time per stage of the paper presets' trainer path on SmolLM2-135M (the smoke run's model, prompts and schedule).

    python -m benchmarks.paper_path                      # a fresh run in a temporary directory
    python -m benchmarks.paper_path schedule.planning_updates=4 schedule.steps_per_generation=4   # more overrides

The run is ``experiment=smoke`` (2 Planning, 2 Execution, 2 Evaluation updates, one sampling phase of S = 2 per
block) with every ``trainer.*`` setting of the CPU rehearsal of the paper presets (tests/distributed/
paper_rehearsal.py, derived from ``experiment=paper_qwen3_4b``): DeepSpeed ZeRO-3 with ZeRO-Offload (DeepSpeed's CPU
Adam), ref_mode precompute, gradient checkpointing, π_old recomputed at each phase's start, micro-batches of 2. Its
dtype is the presets' ``auto`` (bf16 on a CPU with AMX or AVX512-BF16, else float32; printed). Checkpoints follow the
save cadence (at block ends here: each block is one phase). Printed as benchmarks/outer_loop.py prints the smoke run,
so the two compare stage by stage: generation, sandbox, GRPO updates, records/checkpoints/state (checkpoint_s:
metrics lines, the active player's DeepSpeed checkpoint, the run state and block-end offloads), model load.
"""
from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paper_trainer_overrides() -> list[str]:
    """The rehearsal's ``trainer.*`` overrides (the paper presets' trainer settings that run on a CPU)."""
    rehearsal = _load("paper_rehearsal", HERE.parent / "tests" / "distributed" / "paper_rehearsal.py")
    return [o for o in rehearsal.rehearsal_overrides() if o.startswith("trainer.")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    from benchmarks.outer_loop import run_and_report
    from unifiedplayers.config import compose

    run_dir = Path(tempfile.mkdtemp(prefix="up-paper-path-"))
    overrides = ["experiment=smoke", *paper_trainer_overrides(), f"run_dir={run_dir}", "resume=false",
                 "schedule.print_summary=false", *args.overrides]
    print("overrides: " + " ".join(overrides[1:]))
    run_and_report(compose(overrides), run_dir, t0, cpu0, lambda loop: print(
        f"precision: model {loop.cfg.model.dtype}, trainer {loop.cfg.trainer.dtype} ({loop.cfg.precision_reason})"))


if __name__ == "__main__":
    main()
