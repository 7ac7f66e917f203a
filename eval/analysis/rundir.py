"""The one loader of a training run directory (files named in ``unifiedplayers.rundir``), and the metric keys the
analyses read: if the trainer names a key differently, change it in ``KEYS`` here and nothing else.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from unifiedplayers import rundir

KEYS = {
    "iteration": "outer_iteration",
    "block": "block",
    "step": "update",
    "mean_U": "planning/U",
    # The fixed 128 math + 128 general pool every 50 updates (Appendix D.2, schedule.execution_pool) when the run
    # has it on; else the per-update accuracy as the task's verifiers judge it (a strict majority of the valid ones).
    "execution_accuracy": ("execution/pool_accuracy", "execution/accuracy", "execution/accuracy_by_verifiers"),
    "adversarial_rejection": "evaluation/rho_adv",
    # Table 4 / 7 / 8 quantities, as "{player}/<name>"
    "grad_norm": "{player}/grad_norm",  # global norm before clipping
    "kl": "{player}/kl",
    "clip_frac": "{player}/clip_frac",
    "entropy": "{player}/entropy",  # on the fixed bank of held-out role contexts
    # final / initial, as the trainer logs it: at each block's end; after every n-th update with trainer.entropy_every=n
    "entropy_ratio": ("{player}/entropy_bank/retention", "{player}/entropy_ratio"),
    "accuracy": ("{player}/pool_accuracy", "{player}/accuracy", "{player}/accuracy_by_verifiers"),
    # compute
    "timing_total": "timing/total_s",  # wall seconds of one whole update (rollout included)
    "timing_prefix": "timing/",
    "devices": "timing/devices",  # accelerators used by the update (0 on CPU)
}


@dataclass
class RunData:
    path: Path
    records: list[Any]  # unifiedplayers.diagnostics.records.InteractionRecord
    metrics: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        exp = self.config.get("experiment") if isinstance(self.config, dict) else None
        return str(exp) if exp else self.path.name

    def series(self, key: Any) -> list[tuple[dict[str, Any], float]]:
        """(row, value) of every metrics row that has a finite ``key``, in file order. ``key`` may be a
        tuple of candidate names: the first one with any value is used."""
        for k in (key if isinstance(key, tuple) else (key,)):
            out = []
            for row in self.metrics:
                v = row.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out.append((row, float(v)))
            if out:
                return out
        return []

    def used_key(self, key: Any) -> Optional[str]:
        """The candidate of ``key`` that ``series`` reads (the first with any finite value), or None."""
        for k in (key if isinstance(key, tuple) else (key,)):
            if self.series(k):
                return k
        return None

    def played_records(self) -> list[Any]:
        """Records of tasks that were played (malformed or unused Planning outputs have no trajectories)."""
        return [r for r in self.records if len(r.trajectories) > 0]


def load_run(run_dir: str | Path, need_records: bool = False, need_metrics: bool = False) -> RunData:
    """Everything the analyses read from ``run_dir``; raises ``FileNotFoundError`` naming what is missing."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    records: list[Any] = []
    rec_path = path / rundir.RECORDS
    if rec_path.exists():
        from unifiedplayers.diagnostics.records import load_records

        records = load_records(rec_path)
    elif need_records:
        raise FileNotFoundError(f"{rec_path} not found: this analysis reads the interaction records ξ(q)")
    metrics = rundir.read_jsonl(path / rundir.METRICS, missing_ok=True)
    if need_metrics and not metrics:
        raise FileNotFoundError(f"{path / rundir.METRICS} not found or empty: this analysis reads per-update metrics")
    config: dict[str, Any] = {}
    for name in (rundir.CONFIG, rundir.HYDRA_CONFIG):
        if (path / name).exists():
            import yaml

            config = yaml.safe_load((path / name).read_text()) or {}
            break
    summary_path = path / rundir.SUMMARY_JSON
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return RunData(path=path, records=records, metrics=metrics, config=config, summary=summary)


def key(name: str, player: Optional[str] = None) -> Any:
    """The metrics key (or tuple of candidate keys) of ``name``, for ``player`` where it is per player."""
    k = KEYS[name]
    if player is None:
        return k
    return tuple(x.format(player=player) for x in k) if isinstance(k, tuple) else k.format(player=player)


def write_outputs(run: RunData, name: str, data: dict[str, Any], markdown: str, out_dir: Optional[Path] = None) -> Path:
    """Write ``analysis/<name>.json`` and ``analysis/<name>.md`` under the run (or ``out_dir``)."""
    out = out_dir or (run.path / rundir.ANALYSIS)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    (out / f"{name}.md").write_text(markdown)
    return out


def single_run_main(
    argv: Optional[Sequence[str]],
    description: str,
    name: str,
    analyse: Callable[[RunData], dict[str, Any]],
    to_markdown: Callable[[dict[str, Any]], str],
    need_records: bool = False,
    need_metrics: bool = False,
    figure: Optional[Callable[[dict[str, Any], Path], Any]] = None,
) -> dict[str, Any]:
    """The command line shared by the one-run analyses: read a run, analyse, write json/md (and a PNG)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("run_dir")
    args = ap.parse_args(argv)
    run = load_run(args.run_dir, need_records=need_records, need_metrics=need_metrics)
    result = analyse(run)
    md = to_markdown(result)
    out = write_outputs(run, name, result, md)
    if figure is not None:
        figure(result, out / f"{name}.png")
    print(md + f"\nwritten to {out}")
    return result
