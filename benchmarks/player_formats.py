"""Format rates of the default player prompts (conf/player/default.yaml) on the real backbone.

Samples, with the smoke preset's token budgets and the default sampling temperature:
- Planning: N outputs over the rotating topics -> share of well-formed tasks (question + \\boxed{} answer);
- Execution: N trajectories over the well-formed tasks (tool loop, real sandbox) -> share with a python
  block, with a \\boxed{} final answer, and the status counts;
- Evaluation: N verifiers over the same tasks -> share with a valid check() (parses, compiles, defines it).

    python -m benchmarks.player_formats [--n 24] [overrides ...]     # e.g. player.execution.few_shot=[]
    python -m benchmarks.player_formats --from-run runs/smoke        # the same rates over a run's records
"""
from __future__ import annotations

import argparse
import json
import os
import time

from unifiedplayers.config import compose
from unifiedplayers.models import load_model
from unifiedplayers.players import generate_tasks, solve, write_verifiers
from unifiedplayers.rollout import build_rollout
from unifiedplayers.sandbox import Sandbox
from unifiedplayers.feedback.verifier import compile_verifier

FALLBACK_TASKS = [
    "A box holds 12 pencils. A teacher buys 7 boxes and gives away 30 pencils. How many pencils are left?",
    "A train travels at 80 km per hour for 2.5 hours. How many kilometres does it travel?",
    "Mia saves 15 dollars a week. After how many weeks will she have 240 dollars?",
    "A rectangle is 9 m long and 4 m wide. What is its area in square metres?",
]


def from_run(run_dir: str) -> None:
    """The format rates of every output a run's players produced (records.jsonl)."""
    from pathlib import Path

    from unifiedplayers.diagnostics.records import load_records

    records = load_records(Path(run_dir) / "records.jsonl")
    tasks = len(records)
    well_formed = sum(r.meta.get("status") != "malformed_task" for r in records)
    played = [r for r in records if r.trajectories]
    trajs = [t for r in played for t in r.trajectories]
    code = sum(any(s.type == "code" for s in t.steps) for t in trajs)
    boxed = sum(t.final_answer is not None for t in trajs)
    validity = [v for r in played for v in r.meta.get("verifier_validity", [])]
    statuses: dict[str, int] = {}
    for r in played:
        for s in r.meta.get("trajectory_status", []):
            statuses[s] = statuses.get(s, 0) + 1
    print(json.dumps({
        "run_dir": run_dir,
        "planning_well_formed": f"{well_formed}/{tasks}",
        "execution_python_block": f"{code}/{len(trajs)}",
        "execution_boxed_answer": f"{boxed}/{len(trajs)}",
        "execution_status": statuses,
        "evaluation_valid_check": f"{sum(v == 'valid' for v in validity)}/{len(validity)}",
    }, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from-run", default=None, help="report the rates over the records of an existing run")
    ap.add_argument("--n", type=int, default=24, help="samples per player")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="config overrides (default: experiment=smoke)")
    args = ap.parse_args()
    if args.from_run:
        from_run(args.from_run)
        return
    cfg = compose(["experiment=smoke"] + args.overrides)
    p = cfg.player
    t0 = time.perf_counter()
    model, tok = load_model(cfg.model)
    engine = build_rollout(cfg.rollout, model, tok)
    print(f"model {cfg.model.name} loaded in {time.perf_counter() - t0:.1f} s; load average {os.getloadavg()}")

    t = time.perf_counter()
    per_prompt = 4
    groups = generate_tasks(engine, tok, p, 0, -(-args.n // per_prompt), per_prompt, seed=args.seed)
    tasks = [x for g in groups for x in g][: args.n]
    valid = [x for x in tasks if x.valid]
    reasons: dict[str, int] = {}
    for x in tasks:
        if not x.valid:
            reasons[x.reason] = reasons.get(x.reason, 0) + 1
    t_plan = time.perf_counter() - t
    questions = [x.question for x in valid] or FALLBACK_TASKS
    k = 4
    qs = (questions * args.n)[: -(-args.n // k)]

    t = time.perf_counter()
    with Sandbox(cfg.sandbox) as sb:
        rollouts = [r for row in solve(engine, sb, tok, p, qs, k, seed=args.seed + 1) for r in row][: args.n]
    t_exec = time.perf_counter() - t
    with_code = sum(r.num_tool_calls > 0 or "```python" in r.text for r in rollouts)
    with_answer = sum(r.final_answer is not None for r in rollouts)
    statuses: dict[str, int] = {}
    for r in rollouts:
        statuses[r.status] = statuses.get(r.status, 0) + 1

    t = time.perf_counter()
    m = 3
    vs = [v for row in write_verifiers(engine, tok, p, (questions * args.n)[: -(-args.n // m)], m, seed=args.seed + 2)
          for v in row][: args.n]
    t_eval = time.perf_counter() - t
    compiled = [compile_verifier(v.source) for v in vs]
    ok = sum(c.valid for c in compiled)
    why: dict[str, int] = {}
    for c in compiled:
        if not c.valid:
            key = c.reason.split(":")[0]
            why[key] = why.get(key, 0) + 1

    result = {
        "planning_well_formed": f"{len(valid)}/{len(tasks)}",
        "planning_malformed_reasons": reasons,
        "execution_python_block": f"{with_code}/{len(rollouts)}",
        "execution_boxed_answer": f"{with_answer}/{len(rollouts)}",
        "execution_status": statuses,
        "evaluation_valid_check": f"{ok}/{len(vs)}",
        "evaluation_invalid_reasons": why,
        "seconds": {"planning": round(t_plan, 1), "execution": round(t_exec, 1), "evaluation": round(t_eval, 1)},
        "load_average_end": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if valid:
        print("\nexample task:", valid[0].question, "->", valid[0].expected_answer)
    best = next((r for r in rollouts if r.final_answer is not None), rollouts[0] if rollouts else None)
    if best is not None:
        print("\nexample trajectory:\n" + best.text[:800])
    good = next((v.source for v, c in zip(vs, compiled) if c.valid), None)
    if good:
        print("\nexample verifier:\n" + good[:800])


if __name__ == "__main__":
    main()
