"""Compute accounting: wall-clock and device hours per block (outer iteration x player) and per run (Tables 3 and
14), as eval/README.md defines them.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional, Sequence

from eval.analysis.rundir import RunData, key, single_run_main
from eval.paper_numbers import TABLE3_GPU_HOURS


def _row_seconds(row: dict[str, Any]) -> float:
    v = row.get(key("timing_total"))
    if isinstance(v, (int, float)):
        return float(v)
    prefix = key("timing_prefix")
    return float(sum(v for k, v in row.items()
                     if k.startswith(prefix) and k.endswith("_s") and isinstance(v, (int, float))))


def _default_devices(run: RunData) -> float:
    if "devices" in run.summary:
        return float(run.summary["devices"])
    trainer = run.config.get("trainer", {}) if isinstance(run.config, dict) else {}
    for k in ("devices", "num_gpus"):
        if isinstance(trainer, dict) and isinstance(trainer.get(k), (int, float)):
            return float(trainer[k])
    return 0.0


def compute_accounting(run: RunData) -> dict[str, Any]:
    default_devices = _default_devices(run)
    blocks: dict[tuple[Any, Any], dict[str, float]] = defaultdict(lambda: {"wall_s": 0.0, "device_s": 0.0, "updates": 0})
    for row in run.metrics:
        seconds = _row_seconds(row)
        if seconds <= 0:
            continue
        devices = row.get(key("devices"), default_devices)
        b = blocks[(row.get(key("iteration")), row.get(key("block")))]
        b["wall_s"] += seconds
        b["device_s"] += seconds * float(devices)
        b["updates"] += 1
    table = [{"iteration": it, "block": blk, "updates": v["updates"], "wall_h": v["wall_s"] / 3600,
              "device_h": v["device_s"] / 3600} for (it, blk), v in blocks.items()]
    table.sort(key=lambda r: (str(r["iteration"]), str(r["block"])))
    per_player: dict[str, dict[str, float]] = defaultdict(lambda: {"wall_h": 0.0, "device_h": 0.0})
    for r in table:
        per_player[str(r["block"])]["wall_h"] += r["wall_h"]
        per_player[str(r["block"])]["device_h"] += r["device_h"]
    update_wall_h = sum(r["wall_h"] for r in table)
    run_wall_h = run.summary["wall_s"] / 3600 if "wall_s" in run.summary else update_wall_h
    return {
        "blocks": table, "per_player": dict(per_player),
        "run": {"wall_h": run_wall_h, "update_wall_h": update_wall_h,
                "device_h": sum(r["device_h"] for r in table), "default_devices": default_devices},
        "paper_gpu_hours_per_seed": TABLE3_GPU_HOURS,
    }


def to_markdown(r: dict[str, Any]) -> str:
    lines = ["**Compute accounting**", "", "| iteration | block | updates | wall h | device h |", "|---|---|---|---|---|"]
    for b in r["blocks"]:
        lines.append(f"| {b['iteration']} | {b['block']} | {b['updates']} | {b['wall_h']:.4f} | {b['device_h']:.4f} |")
    run = r["run"]
    lines += ["", f"Run: {run['wall_h']:.4f} wall hours ({run['update_wall_h']:.4f} in updates), "
              f"{run['device_h']:.4f} device hours.",
              "Paper (Qwen3-4B-Base, 8x A100 80GB, GPU-hours per seed): "
              + ", ".join(f"{k} {v}" for k, v in r["paper_gpu_hours_per_seed"].items()) + "."]
    return "\n".join(lines) + "\n"


analyse = compute_accounting


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    return single_run_main(argv, "Wall and device hours per block and run", "compute", analyse, to_markdown,
                           need_metrics=True)


if __name__ == "__main__":
    main()
