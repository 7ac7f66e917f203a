"""Wall time of the smoke preset (`make run`), broken into generation, sandbox work and GRPO updates.

    python -m benchmarks.outer_loop                     # a fresh smoke run in a temporary directory
    python -m benchmarks.outer_loop --run-dir runs/smoke   # the figures of an existing run (no new run)
    python -m benchmarks.outer_loop trainer.num_threads=1  # extra config overrides

Generation = Planning, Execution and Evaluation sampling (sandbox time inside the tool loop excluded);
sandbox = tool calls, perturbation re-executions and verdict checks; update = trainer.update (GRPO
forward/backward/step, entropy bank); checkpoint = the metrics line, the active player's checkpoint and
the run state (on the cadence ``schedule.save_every``), and at block ends the optimizer state's offload; the rest is start-up (imports, model load, sandbox start) and the
summary. The run directory's size on disk is printed at the end (the checkpoints left by the run).
The machine's load average is printed too: on a shared machine wall times are only upper bounds.

``--floors`` sets the run against what this machine allows (``benchmarks/precision_floors.py``'s floors, measured
after the run in the same process): generation against its bandwidth floor, every sampled token of a batch's
longest row being one read of the sampling model's weights (``tokens x weight bytes / bandwidth``, the bandwidth
measured with the sampling thread count), and the GRPO updates against their GEMM floor (the trainer's
``{role}/update_tflop`` at the update's matmul rate, measured on the shapes of ``grpo_update.py``'s micro-batch with
the update thread count). Their sum, with the run's sandbox and checkpoint time, is the least this run's work can
take here with any implementation of the same ops.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch


def total(metrics: list[dict], key: str) -> float:
    """``key`` summed over the run's metrics lines (a missing or null value counts 0)."""
    return sum(m.get(key) or 0.0 for m in metrics)


def report(run_dir: Path, wall: float | None = None, timing: dict | None = None) -> None:
    from unifiedplayers.diagnostics.logging import read_metrics

    metrics = read_metrics(run_dir)
    gen, sb, upd, whole = (total(metrics, f"timing/{k}_s") for k in ("generation", "sandbox", "update", "total"))
    print(f"run dir {run_dir}: {len(metrics)} updates")
    rows = [("generation", gen), ("sandbox", sb), ("GRPO updates", upd), ("other per-update work", whole - gen - sb - upd)]
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


class DecodeReads:
    """The weight reads of every batch the hf engine samples while :meth:`counting`: one per sampled token of the
    batch's longest row (its prefill and each decoding step read every weight once), in bytes of the sampling
    model's dtype (``precision_floors.weight_bytes``)."""

    def __init__(self) -> None:
        self.batches = self.passes = self.bytes = 0
        self._sizes: dict[int, int] = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from benchmarks.precision_floors import weight_bytes

        from unifiedplayers.rollout.hf_engine import HFRollout

        plain = HFRollout._sample_batch

        def counted(engine, prompts, *args, **kwargs):
            out = plain(engine, prompts, *args, **kwargs)
            key = id(engine.model)
            if key not in self._sizes:
                dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
                self._sizes[key] = weight_bytes(engine.model, dtype)
            passes = max(len(c.token_ids) for c in out)
            self.batches, self.passes = self.batches + 1, self.passes + passes
            self.bytes += passes * self._sizes[key]
            return out

        HFRollout._sample_batch = counted
        try:
            yield
        finally:
            HFRollout._sample_batch = plain


def report_floors(cfg, run_dir: Path, reads: DecodeReads, model) -> None:
    """Generation and the GRPO updates of the run in ``run_dir`` against this machine's floors (module docstring)."""
    from benchmarks.precision_floors import gemm_floors, memory_bandwidth, update_rows

    from unifiedplayers.diagnostics.logging import read_metrics

    metrics = read_metrics(run_dir)
    dtype = str(cfg.trainer.dtype)  # the run resolved ``auto``
    threads = torch.get_num_threads()
    torch.set_num_threads(max(cfg.trainer.num_threads, 1))
    bw = memory_bandwidth()["gb_s"]
    torch.set_num_threads(max(cfg.trainer.update_threads or cfg.trainer.num_threads, 1))
    rows, head_rows = update_rows(49, 256, cfg.trainer.micro_batch_size, cfg.trainer.logprob_chunk_rows)
    rate = gemm_floors(model, rows, head_rows, [dtype], rounds=1)[dtype]["gflop_per_s"]
    torch.set_num_threads(threads)
    gen_floor = reads.bytes / (bw * 1e9)
    tflop = sum(v or 0.0 for m in metrics for k, v in m.items() if k.endswith("/update_tflop"))  # "{role}/update_tflop"
    upd_floor = tflop * 1e12 / (rate * 1e9)
    gen, upd = total(metrics, "timing/generation_s"), total(metrics, "timing/update_s")
    print(f"  floors ({os.getloadavg()[0]:.2f} load): {reads.batches} sampled batches, {reads.passes} weight passes "
          f"({reads.bytes / 1e9:.1f} GB) at {bw:.1f} GB/s ({max(cfg.trainer.num_threads, 1)} thread(s))")
    print(f"    generation    {gen:7.1f} s against a floor of {gen_floor:6.1f} s ({gen / max(gen_floor, 1e-9):.1f}x)")
    print(f"    GRPO updates  {upd:7.1f} s against a floor of {upd_floor:6.1f} s ({upd / max(upd_floor, 1e-9):.1f}x;"
          f" {tflop:.2f} TFLOP at {rate:.0f} GFLOP/s, {dtype})")
    print(f"    generation + updates + sandbox at their floors: "
          f"{gen_floor + upd_floor + total(metrics, 'timing/sandbox_s'):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="report an existing run instead of running one")
    ap.add_argument("--floors", action="store_true", help="set generation and updates against this machine's floors")
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
    run_and_report(cfg, run_dir, t0, cpu0, floors=args.floors)


def run_and_report(cfg, run_dir: Path, t0: float, cpu0: float, before_report=None, floors: bool = False) -> None:
    """Run ``cfg`` in ``run_dir`` with the load average printed before and after, then :func:`report` it and the
    run directory's size (``t0``, ``cpu0``: wall and CPU clocks at the start; ``before_report(loop)``: extra lines;
    ``floors``: :func:`report_floors` too)."""
    from unifiedplayers.loop.outer import OuterLoop

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    print(f"load average at start {os.getloadavg()}, torch threads {torch.get_num_threads()}, cores {os.cpu_count()}")
    loop = OuterLoop(cfg, run_dir)
    reads = DecodeReads()
    with reads.counting() if floors else contextlib.nullcontext():
        loop.run()
    wall = time.perf_counter() - t0
    if before_report is not None:
        before_report(loop)
    report(run_dir, wall, loop.state.timing)
    print(f"  process CPU time {time.process_time() - cpu0:.1f} s; load average at end {os.getloadavg()}")
    if floors:
        report_floors(cfg, run_dir, reads, next(iter(loop.players.values())).model)
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    print(f"  run directory on disk: {size / 1e9:.2f} GB ({run_dir})")


if __name__ == "__main__":
    main()
