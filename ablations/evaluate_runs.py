"""Evaluate every finished run directory of a sweep with the harness in ``eval/`` (its Execution player).

    python -m ablations.evaluate_runs runs/ablations/ablation_smoke/table3 --eval ablation_smoke

A run already evaluated (``eval/results.json``) or whose training has not finished is skipped, so an interrupted
sweep resumes. Otherwise the run's backbone is loaded with its latest Execution checkpoint and evaluated with the
``eval`` preset into ``<run>/eval/``, in the mode, W&B group and tags the run's config gives
(``eval.run.apply_run_config``). ``--adv-reject`` also measures Table 15's Adv. Reject (``ablations.adv_reject``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from joblib import Parallel, delayed
from omegaconf import OmegaConf

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from ablations.adv_reject import measure_run  # noqa: E402
from ablations.aggregate import ADV_REJECT_FILE, RESULTS_FILE, find_run_dirs  # noqa: E402
from eval.config import register_eval_configs  # noqa: E402
from eval.run import apply_run_config, build_engine, evaluate  # noqa: E402
from unifiedplayers import rundir  # noqa: E402
from unifiedplayers.config import compose  # noqa: E402


def eval_config(run_cfg: Any, preset: str, overrides: Sequence[str] = ()) -> Any:
    """The ``conf/evaluate.yaml`` config of one run (``eval.run.apply_run_config``, as ``make eval CKPT=<run dir>``)."""
    register_eval_configs()
    cfg = compose([f"eval={preset}", *overrides], config_name="evaluate")
    explicit = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    apply_run_config(cfg, run_cfg, explicit, log=lambda *a: None)
    cfg.logger = OmegaConf.merge(cfg.logger, run_cfg.logger)
    return cfg


def has_evaluation_player(run_cfg: Any) -> bool:
    """Whether the run's method trains an Evaluation player (UnifiedPlayers': the one Table 15 measures)."""
    return bool(run_cfg.method.trainable) and "evaluation" in list(OmegaConf.select(run_cfg, "method.roles") or [])


def evaluate_run(run_dir: Path, preset: str, overrides: Sequence[str] = (), log=print,
                 adv_reject: bool = False) -> Optional[dict]:
    """Evaluate one run directory; returns its results, or None when it was skipped."""
    out = run_dir / rundir.EVAL
    run_cfg = OmegaConf.load(run_dir / rundir.CONFIG)
    if run_cfg.method.trainable and not (run_dir / rundir.SUMMARY_JSON).exists():
        log(f"[evaluate] {run_dir}: training not finished, skipped (rerun the sweep to resume it)")
        return None
    if adv_reject and has_evaluation_player(run_cfg) and not (out / ADV_REJECT_FILE).exists():
        measure_run(run_dir, log=log)
    if (out / RESULTS_FILE).exists():
        log(f"[evaluate] {run_dir}: already evaluated")
        return None
    cfg = eval_config(run_cfg, preset, overrides)
    cfg.ckpt = str(run_dir) if run_cfg.method.trainable else None
    t0 = time.time()
    engine = build_engine(cfg, log=log)
    results = evaluate(cfg, out, engine=engine, log=log)
    log(f"[evaluate] {run_dir}: done in {time.time() - t0:.0f}s")
    return results


def _evaluate_in_worker(run_dir: Path, preset: str, overrides: Sequence[str], threads: int,
                        adv_reject: bool = False) -> bool:
    if threads > 0:
        torch.set_num_threads(threads)
    return evaluate_run(Path(run_dir), preset, overrides, log=lambda m: print(m, flush=True),
                        adv_reject=adv_reject) is not None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--eval", default="paper", help="conf/eval preset (default: paper)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per evaluation (0: torch's default)")
    ap.add_argument("--jobs", type=int, default=1, help="run directories evaluated at a time (processes)")
    ap.add_argument("--adv-reject", action="store_true",
                    help="also measure Table 15's Adv. Reject on the fixed held-out set (ablations.adv_reject)")
    ap.add_argument("overrides", nargs="*", help="further overrides of conf/evaluate.yaml, e.g. eval.limit=5")
    args = ap.parse_intermixed_args(argv)
    dirs = find_run_dirs(args.sweep_dir)
    jobs = args.jobs if args.jobs > 1 and len(dirs) > 1 else 1  # one job: in this process
    flags = Parallel(n_jobs=jobs, backend="loky")(
        delayed(_evaluate_in_worker)(d, args.eval, args.overrides, args.threads, args.adv_reject) for d in dirs)
    print(f"[evaluate] {args.sweep_dir}: evaluated {sum(flags)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
