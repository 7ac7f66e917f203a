"""One rank of the diagnostic pool's evaluations (launched by tests/distributed/test_pool_ranks.py under torchrun;
the test calls :func:`run_scenarios` in-process for the one-rank reference).

Each scenario evaluates the pool at every checkpoint of a short Execution-only schedule (the initial one and
after each of 4 updates) through the outer loop's :class:`~unifiedplayers.loop.run_files.DiagnosticPool`, with a
stand-in team whose Execution engine changes with the checkpoint:

- ``scripted``: 3 math + 2 general questions; the engine runs one code block in the rank's sandbox, then answers
  question i right at checkpoint c unless (i + c) % 3 == 0;
- ``one``: a single question (fewer than the ranks), the same engine;
- ``none``: no question at all (its file is missing): every checkpoint recorded as skipped;
- ``model``: 4 + 3 questions answered greedily by the tiny random model, its weights nudged at each checkpoint;
- ``scripted_again``: ``scripted`` once more in the same run directory: every checkpoint is read back from the log.

Every rank writes ``OUT.rank<r>.json``: for each scenario the (checkpoint, question id) pairs it graded and, on
rank 0, the metrics lines, execution_pool.jsonl's rows and the pool's summary.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import unifiedplayers.diagnostics.execution_pool as execution_pool
from unifiedplayers.config import compose
from unifiedplayers.diagnostics.execution_pool import pool_summary
from unifiedplayers.rundir import EXECUTION_POOL
from unifiedplayers.distributed import destroy, init_distributed, sandbox_config
from unifiedplayers.loop import ranks
from unifiedplayers.loop.ranks import every_rank
from unifiedplayers.loop.run_files import DiagnosticPool
from unifiedplayers.loop.team import Team
from unifiedplayers.schedule import Update, total_updates, trained_roles
from unifiedplayers.sandbox import Sandbox
from tests.players.scripted import ScriptedEngine  # noqa: E402

BASE = ["experiment=tiny", "schedule.planning_updates=0", "schedule.evaluation_updates=0",
        "schedule.execution_updates=4", "schedule.execution_pool.every=1", "schedule.execution_pool.max_turns=2",
        "schedule.execution_pool.max_new_tokens=32"]  # the byte tokenizer: one token per character
SCENARIOS: dict[str, list[str]] = {
    "scripted": ["schedule.execution_pool.math_size=3", "schedule.execution_pool.general_size=2"],
    "one": ["schedule.execution_pool.math_size=1", "schedule.execution_pool.general_size=0"],
    "none": ["schedule.execution_pool.math_path=/nonexistent/gone.jsonl", "schedule.execution_pool.general_size=0"],
    "model": ["schedule.execution_pool.math_size=4", "schedule.execution_pool.general_size=3"],
}


def right_at(i: int, checkpoint: int) -> bool:
    """Whether the scripted engine answers question ``i`` right at ``checkpoint``."""
    return (i + checkpoint) % 3 != 0


class PoolTeam:
    """What the pool reads of the outer loop's team: the tokenizer, the Execution engine of a checkpoint (set on
    every rank), the rank's sandbox, and the team's own :meth:`~unifiedplayers.loop.team.Team.answer_pool`."""

    answer_pool = Team.answer_pool

    def __init__(self, tokenizer: Any, engine_at: Any) -> None:
        self.tokenizer, self.engine_at, self.step, self.dist, self.sandbox = tokenizer, engine_at, 0, None, None

    @every_rank
    def at_checkpoint(self, step: int) -> None:
        self.step = step

    def sampler(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        return None, {"player": "execution", "outer_iteration": 1, "step": self.step}

    def engine(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        return self.engine_at(self.step), self.sampler(role, active)[1]


def scripted_engines(tokenizer: Any, questions: list[Any]) -> Any:
    """``engine_at(checkpoint)``: one code block (run in the sandbox), then a right or a wrong final answer."""
    def engine_at(checkpoint: int) -> ScriptedEngine:
        def respond(context: str, j: int) -> str:
            if "```output" not in context:
                return "```python\nprint(6 * 7)\n```\n"
            i = next(k for k, q in enumerate(questions) if q.problem.question in context)
            return f"\\boxed{{{questions[i].problem.reference if right_at(i, checkpoint) else 'Z'}}}"
        return ScriptedEngine(tokenizer, respond)
    return engine_at


def model_engines(cfg: Any) -> tuple[Any, Any]:
    """(tokenizer, ``engine_at(checkpoint)``): the tiny random model, every weight nudged by a checkpoint's noise."""
    from unifiedplayers.models import load_model
    from unifiedplayers.rollout import build_rollout

    model, tokenizer = load_model(cfg.model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    engine = build_rollout(cfg.rollout, model, tokenizer)

    def engine_at(checkpoint: int) -> Any:
        noise = torch.Generator().manual_seed(checkpoint)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name] + 0.05 * torch.randn(p.shape, generator=noise))
        engine.update_weights(model)
        return engine
    return tokenizer, engine_at


def evaluate_checkpoints(dist: Any, run_dir: Path, cfg: Any, team: PoolTeam) -> list[dict[str, Any]]:
    """The pool's metrics lines of the schedule's updates (one Execution block), as the outer loop makes them: rank 0
    leads (its team sends each checkpoint's step), the other ranks follow (no lines)."""
    lines: list[dict[str, Any]] = []
    team.dist, total = dist, total_updates(cfg)
    with Sandbox(sandbox_config(cfg.sandbox, dist)) as sandbox:
        team.sandbox = sandbox
        if not dist.is_main:
            ranks.follow(dist, team)
            return lines
        pool, timing = DiagnosticPool(cfg, run_dir, trained_roles(cfg)), {"pool_s": 0.0}
        for index in range(total):
            at = Update(1, "execution", index, 0, index)
            line = {}
            if index == 0:
                team.at_checkpoint(0)
                line = pool.metrics(at, team, cfg.player, timing, before=True)
            team.at_checkpoint(index + 1)
            line.update(pool.metrics(at, team, cfg.player, timing))
            lines.append({k: v for k, v in line.items() if not k.startswith("timing/")})
        ranks.stop(dist, total, True)
    return lines


def scenario(dist: Any, run_dir: Path, name: str) -> dict[str, Any]:
    cfg = compose(BASE + SCENARIOS[name.removesuffix("_again")])
    graded: list[tuple[int, str]] = []
    team = PoolTeam(None, None)
    real_grade = execution_pool.grade_text

    def grade(q: Any, text: str) -> Any:
        graded.append((team.step, q.problem.id))
        return real_grade(q, text)

    if name == "model":
        team.tokenizer, team.engine_at = model_engines(cfg)
    else:
        from unifiedplayers.models import build_byte_tokenizer

        team.tokenizer = build_byte_tokenizer()  # the tiny model's
        questions, _ = execution_pool.build_pool(cfg.schedule.execution_pool)
        team.engine_at = scripted_engines(team.tokenizer, questions)
    execution_pool.grade_text = grade
    try:
        lines = evaluate_checkpoints(dist, run_dir, cfg, team)
    finally:
        execution_pool.grade_text = real_grade
    out: dict[str, Any] = {"graded": graded}
    if dist.is_main:
        rows = [json.loads(x) for x in (run_dir / EXECUTION_POOL).read_text().splitlines()]
        out.update(lines=lines, rows=[{k: v for k, v in r.items() if k != "seconds"} for r in rows],
                   summary=pool_summary(lines, run_dir))
    return out


def run_scenarios(dist: Any, root: Path) -> dict[str, Any]:
    """Every scenario of the module docstring on this rank, each in its run directory under ``root``."""
    out = {}
    for name in ("scripted", "one", "none", "model", "scripted_again"):
        out[name] = scenario(dist, root / name.removesuffix("_again"), name)
    return out


def main(root: str, out: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        result = run_scenarios(dist, Path(root))
    finally:
        destroy(dist)
    with open(f"{out}.rank{dist.rank}.json", "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
