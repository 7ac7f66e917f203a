"""``python -m eval.probes TARGET [--roles ...] [--out probes.json] [key=value ...]``: see :mod:`eval.probes`."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from eval.probes import ROLES, ProbeSizes, probe  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m eval.probes", description="Held-out probes of the three players.")
    ap.add_argument("target", help="'backbone', a run directory, checkpoints/iter<N>, or checkpoints/iter<N>/<role>")
    ap.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. experiment=smoke without a run)")
    ap.add_argument("--run", help="the run whose config.yaml (model, prompts, sandbox) to use; default: the target's run")
    ap.add_argument("--roles", default=",".join(ROLES), help="comma-separated subset of planning,execution,evaluation")
    ap.add_argument("--out", help="write the result (JSON) here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    d = ProbeSizes()
    ap.add_argument("--execution", type=int, default=d.execution, help="Execution problems (default: all 100)")
    ap.add_argument("--tool", type=int, default=d.execution_tool,
                    help="Execution tool-probe problems, run with the Execution probe (default: all 50)")
    ap.add_argument("--evaluation", type=int, default=d.evaluation, help="Evaluation questions (default: all 50)")
    ap.add_argument("--verifiers", type=int, default=d.evaluation_verifiers, help="M verifiers per question")
    ap.add_argument("--topics", type=int, default=d.planning_topics, help="Planning topic prompts (default: all 25)")
    ap.add_argument("--tasks-per-topic", type=int, default=d.planning_tasks_per_topic)
    ap.add_argument("--u-tasks", type=int, default=d.planning_u_tasks, help="well-formed tasks whose U(q) is measured")
    ap.add_argument("--u-samples", type=int, default=d.planning_u_samples, help="K backbone trajectories per such task")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(max(1, args.threads))
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    sizes = ProbeSizes(execution=args.execution, evaluation=args.evaluation, evaluation_verifiers=args.verifiers,
                       planning_topics=args.topics, planning_tasks_per_topic=args.tasks_per_topic,
                       planning_u_tasks=args.u_tasks, planning_u_samples=args.u_samples, execution_tool=args.tool)
    result = probe(args.target, roles, args.run, args.overrides, sizes, args.out)
    print(f"[probe] {args.target}: {result['seconds']['total']:.0f} s in all")
    if args.out:
        print(args.out)
    return result


if __name__ == "__main__":
    main()
