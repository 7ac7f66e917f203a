"""The golden check on the embedded SmolLM2: the smoke preset in float32, one fixed seed, for
unifiedplayers, r_zero, agent0 and absolute_zero (two players), written by two versions of the code on the
same machine, must give the same records.jsonl and metrics.jsonl (``timing/*`` and ``perf/*`` keys aside).

Too slow for the test suite (4 to 12 minutes a run on 2 cores); run it by hand around a refactor:

    python -m tests.golden.smoke_runs run OUT_BEFORE     # on the commit before (PYTHONPATH=<its src>)
    python -m tests.golden.smoke_runs run OUT_AFTER      # on the commit after
    python -m tests.golden.smoke_runs compare OUT_BEFORE OUT_AFTER

It drives the command line only (``python -m unifiedplayers.train``), so any version of the package runs it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

METHODS = {
    "unifiedplayers": [],
    "r_zero": ["method=r_zero"],
    "agent0": ["method=agent0"],
    "absolute_zero": ["method=absolute_zero", "method.shared_model=false"],
}
COMMON = ["experiment=smoke", "seed=0", "trainer.dtype=float32", "model.dtype=float32", "logger=none",
          "resume=false", "schedule.print_summary=false", "trainer.num_threads=1"]


def run(out: Path, methods=None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in methods or METHODS:
        run_dir = out / name
        if (run_dir / "summary.json").exists():
            print(f"{name}: done already", flush=True)
            continue
        t = time.time()
        cmd = [sys.executable, "-m", "unifiedplayers.train", *COMMON, *METHODS[name], f"run_dir={run_dir}"]
        subprocess.run(cmd, check=True)
        print(f"{name}: {time.time() - t:.0f} s", flush=True)


def _lines(path: Path) -> list:
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not k.startswith(("timing/", "perf/"))}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return [strip(json.loads(s)) for s in path.read_text().splitlines() if s.strip()]


def compare(a: Path, b: Path) -> int:
    from tests.golden.test_golden import assert_same

    bad = 0
    for name in METHODS:
        if not ((a / name / "summary.json").exists() and (b / name / "summary.json").exists()):
            print(f"{name}: not run on both sides")
            bad += 1
            continue
        for f in ("records.jsonl", "metrics.jsonl"):
            try:
                assert_same(_lines(b / name / f), _lines(a / name / f), f"{name}/{f}", new_keys_allowed=f == "metrics.jsonl")
                print(f"{name}/{f}: same ({len(_lines(a / name / f))} lines)")
            except AssertionError as e:
                bad += 1
                print(f"{name}/{f}: DIFFERENT: {str(e)[:300]}")
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]), sys.argv[3:] or None)
    else:
        sys.exit(1 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
