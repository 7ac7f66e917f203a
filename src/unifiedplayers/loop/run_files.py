"""The outer loop's side effects, kept out of it (rank 0 writes every file; the other ranks only follow its calls):

- :class:`RunFiles`: records.jsonl (one interaction record ξ(q) per Planning output), metrics.jsonl and W&B
  (one line per update), and the progress bar;
- :class:`DiagnosticPool`: the fixed diagnostic pool (Appendix D.2, ``schedule.execution_pool``); answering it
  leaves the RNG states as it found them (``Team.answer_pool``), so a run with the pool on trains as one without;
- :func:`finish`: the end-of-run summary and the checkpoint retention.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from unifiedplayers.loop.checkpoints import prune
from unifiedplayers.diagnostics.execution_pool import FixedPool, metrics_of
from unifiedplayers.diagnostics.logging import RunLogger, progress
from unifiedplayers.diagnostics.records import RecordWriter
from unifiedplayers.rundir import RECORDS
from unifiedplayers.schedule import Update


class RunFiles:
    """records.jsonl, metrics.jsonl (and W&B), and the progress bar of a run (rank 0's)."""

    def __init__(self, cfg: Any, run_dir: Path, total: int, completed: int, run_id: str) -> None:
        self.logger = RunLogger(run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True), run_id=run_id)
        self.writer = RecordWriter(run_dir / RECORDS)
        self.bar = progress(total=total, desc="updates", enabled=bool(cfg.logger.progress), initial=completed,
                            position=0)

    def __enter__(self) -> "RunFiles":
        self.writer.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()
        self.writer.__exit__(*exc)
        self.logger.close()

    def progress(self, name: str) -> None:
        """Show what the current update is doing."""
        self.bar.set_postfix_str(name)

    def start_update(self, at: Update, block_size: int) -> None:
        self.bar.set_description_str(f"it {at.iteration} {at.role} {at.step_in_block + 1}/{block_size}")

    def records(self, records: Sequence[Any]) -> None:
        for rec in records:
            self.writer.append(rec)

    def metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.logger.log(metrics, step=step)

    def end_update(self) -> None:
        self.bar.update(1)


class DiagnosticPool:
    """The fixed diagnostic pool of the Execution player; every rank answers its block of the questions, rank 0 grades
    them and writes execution_pool.jsonl and the metrics."""

    def __init__(self, cfg: Any, run_dir: Path, trained: Sequence[str]) -> None:
        self.cfg = cfg.schedule.execution_pool
        self.pool = FixedPool(self.cfg, run_dir) if self.cfg.every > 0 and "execution" in trained else None
        self.block_size = int(cfg.schedule.execution_updates)

    def metrics(self, at: Update, team: Any, execution_cfg: Any, timing: dict[str, float],
                progress: Any = None, before: bool = False) -> dict[str, Any]:
        """The pool's metrics after update ``at`` when an evaluation is due, else {}. ``before``: the initial
        checkpoint (update 0, Appendix D.2), before the run's first update, as ``execution/pool0_*``."""
        if self.pool is None or (at.role != "execution" and not before):
            return {}
        # the pool's checkpoint: the Execution updates done (every iteration has one Execution block)
        step = 0 if before else (at.iteration - 1) * self.block_size + at.step_in_block + 1
        if not self.pool.due(step):
            return {}
        if progress is not None:
            progress(f"execution pool ({len(self.pool.questions)} questions)")
        where = {"global_update": at.index - (1 if before else 0), "outer_iteration": at.iteration,
                 "checkpoint": team.sampler("execution", "execution")[1]}
        entry = self.pool.evaluate(step, where, lambda: team.answer_pool(execution_cfg, self.cfg, self.pool.questions))
        timing["pool_s"] += entry.get("seconds", 0.0)
        out = metrics_of(entry)
        return {k.replace("execution/pool_", "execution/pool0_") if before else k: v for k, v in out.items()
                if not (before and k.startswith("timing/"))}


def finish(cfg: Any, run_dir: Path, finished: bool, timing: Optional[dict[str, float]]) -> dict[str, Any]:
    """The end of a run: the summary and, for a finished run, ``schedule.checkpoint_retention``. ``timing`` None: the
    summary of an already finished run."""
    from unifiedplayers.diagnostics.summary import write_summary

    summary, text = write_summary(run_dir, timing=timing, png=cfg.schedule.summary_png)
    if finished:
        prune(run_dir, cfg.schedule.checkpoint_retention)
    if cfg.schedule.print_summary:
        print(text)
    return summary

