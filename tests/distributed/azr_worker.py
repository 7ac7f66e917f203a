"""One rank of the Absolute Zero broadcast test (launched by tests/distributed/test_absolute_zero_torchrun.py
under torchrun): rank 0 builds code tasks in its sandbox and broadcasts them exactly as the outer loop does
(``sampling.PhaseSampler``: ``method.build_task`` on rank 0, then ``dist.broadcast``); every rank then grades the same answers with the tasks it holds and writes a JSON.

``OUT RUN_DIR DUMP OVERRIDES...``: the same launch then runs an outer loop as dp_worker.py does (one start-up of
the ranks for both)."""
from __future__ import annotations

import json
import sys

from unifiedplayers.config import compose
from unifiedplayers.distributed import destroy, init_distributed
from unifiedplayers.methods import build_method
from unifiedplayers.players.planning import PlanningTask
from unifiedplayers.sandbox import Sandbox, SandboxConfig

PROPOSAL = ("```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n```input\n5\n```\n"
            "```input\n6\n```\n```input\n7\n```")
ANSWERS = {"deduction": ["12", "13"], "abduction": ["4", "5"],
           "induction": ["lambda x: 3 * x", "lambda x: {4: 12, 5: 15}[x]"]}


def broadcast_and_grade(dist, out: str) -> None:
    build = build_method(compose(["method=absolute_zero"])).build_task
    with Sandbox(SandboxConfig(timeout_s=5.0)) as sandbox:
        raw = [PlanningTask(PROPOSAL, None, None, False, "", topic=t) for t in ANSWERS]
        tasks = dist.broadcast([build(t, sandbox) for t in raw] if dist.is_main else None)
        result = {"rank": dist.rank, "unbound": [], "grades": {}}
        for task in tasks:
            if task.check.sandbox is None:  # crossed the broadcast: re-bound to this rank's sandbox
                result["unbound"].append(task.topic)
                task.check.bind(sandbox)
            result["grades"][task.topic] = [task.check(a) for a in ANSWERS[task.topic]]
        result["questions"] = [t.question for t in tasks]
    with open(f"{out}.rank{dist.rank}.json", "w") as fh:
        json.dump(result, fh)


def main(out: str, *loop: str) -> None:
    # With a loop to run, the job starts as dp_worker.py's does (its default backend: gloo on CPU).
    dist = init_distributed(backend=None if loop else "gloo")
    try:
        broadcast_and_grade(dist, out)
        if loop:
            import torch
            from tests.distributed.dp_worker import run

            torch.set_num_threads(1)
            run(dist, *loop)
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
