"""Wall time of the smoke preset (`make run`), broken into generation, sandbox work and GRPO updates.

    python benchmarks/outer_loop.py                     # a fresh smoke run in a temporary directory
    python benchmarks/outer_loop.py --run-dir runs/smoke   # the figures of an existing run (no new run)
    python benchmarks/outer_loop.py trainer.num_threads=1  # extra config overrides

Generation = Planning, Execution and Evaluation sampling (sandbox time inside the tool loop excluded);
sandbox = tool calls, perturbation re-executions and verdict checks; update = trainer.update (GRPO
forward/backward/step, entropy bank); checkpoint = the metrics line, the active player's checkpoint and
the run state (on the cadence ``schedule.save_every``), and at block ends the optimizer state's offload; the rest is start-up (imports, model load, sandbox start) and the
summary. The run directory's size on disk is printed at the end (the checkpoints left by the run).
The machine's load average is printed too: on a shared machine wall times are only upper bounds.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch


def report(run_dir: Path, wall: float | None = None, timing: dict | None = None) -> None:
    from unifiedplayers.diagnostics.logging import read_metrics

    metrics = read_metrics(run_dir)
    tot = lambda k: sum(m.get(k) or 0.0 for m in metrics)  # noqa: E731
    gen, sb, upd, total = tot("timing/generation_s"), tot("timing/sandbox_s"), tot("timing/update_s"), tot("timing/total_s")
    print(f"run dir {run_dir}: {len(metrics)} updates")
    rows = [("generation", gen), ("sandbox", sb), ("GRPO updates", upd), ("other per-update work", total - gen - sb - upd)]
    if timing:
        rows.append(("records, checkpoints, state", timing.get("checkpoint_s", 0.0)))
        rows.append(("model load", timing.get("model_load_s", 0.0)))
    for name, sec in rows:
        print(f"  {name:<28} {sec:8.1f} s")
    if wall is not None:
        print(f"  {'wall time (whole run)':<28} {wall:8.1f} s  ({wall / 60:.1f} min)")
    print("  per update:")
    for m in metrics:
        print(f"    it {m['outer_iteration']} {m['block']:<10} #{m['update']}: total {m['timing/total_s']:6.1f} s  "
              f"generation {m['timing/generation_s']:6.1f}  sandbox {m['timing/sandbox_s']:5.1f}  "
              f"update {m['timing/update_s']:6.1f}  cpu {m.get('timing/cpu_s') or 0:6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="report an existing run instead of running one")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.run_dir is not None:
        report(args.run_dir)
        return
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    from unifiedplayers.config import compose
    from unifiedplayers.loop.outer import OuterLoop

    run_dir = Path(tempfile.mkdtemp(prefix="up-smoke-bench-"))
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", "resume=false", "schedule.print_summary=false"]
                  + args.overrides)
    run_and_report(cfg, run_dir, t0, cpu0)


def run_and_report(cfg, run_dir: Path, t0: float, cpu0: float, before_report=None) -> None:
    """Run ``cfg`` in ``run_dir`` with the load average printed before and after, then :func:`report` it and the
    run directory's size (``t0``, ``cpu0``: wall and CPU clocks at the start; ``before_report(loop)``: extra lines)."""
    from unifiedplayers.loop.outer import OuterLoop

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    print(f"load average at start {os.getloadavg()}, torch threads {torch.get_num_threads()}, cores {os.cpu_count()}")
    loop = OuterLoop(cfg, run_dir)
    loop.run()
    wall = time.perf_counter() - t0
    if before_report is not None:
        before_report(loop)
    report(run_dir, wall, loop.state.timing)
    print(f"  process CPU time {time.process_time() - cpu0:.1f} s; load average at end {os.getloadavg()}")
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    print(f"  run directory on disk: {size / 1e9:.2f} GB ({run_dir})")


if __name__ == "__main__":
    main()
