"""Malformed model outputs become recorded failures, never crashes: a Planning output without an answer,
trajectories without code or answer, an unterminated code block, an endless tool loop, code that
crashes, a verifier that does not compile and one that never returns. The tiny random model cannot
write such text on purpose, so a scripted engine speaks for all three players here."""
from __future__ import annotations

import numpy as np
import pytest

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.diagnostics.records import load_records
from unifiedplayers.loop.outer import OuterLoop
from tests.players.scripted import ScriptedEngine

pytestmark = pytest.mark.cpu

TASK = "Ann has 6 bags with 7 apples in each bag. How many apples does she have?"
PLANNING = [TASK + "\nAnswer: \\boxed{42}", "I have no idea what to write."]
EXECUTION_FIRST = [
    "The answer is forty-two, I am sure of it.",              # no code, no answer -> no_answer
    "Let me compute.\n```python\nprint(6 * 7)",               # unterminated block at eos -> error
    "Loop.\n```python\nprint(1)\n```\n",                       # asks for code every turn -> turn_limit
    "Compute.\n```python\nprint(6 * 7)\n```\n",               # then answers 42 -> answered
    "Crash.\n```python\nprint(1 / 0)\n```\n",                 # traceback observation, then a wrong answer
]
VERIFIERS = [
    "```python\ndef check(trajectory):\n    ok = trajectory.final_answer == '42'\n    return ok if ok else (False, 0)\n```",
    "```python\ndef check(trajectory):\n    return (\n```",                  # does not compile
    "```python\ndef check(trajectory):\n    while True:\n        pass\n```",  # never returns: sandbox timeout (no variants here: P = 0 keeps this test short)
]


def respond(ctx: str, index: int) -> str:
    reply = ctx.split("<|im_start|>assistant\n")[-1]
    if "Write a math problem" in ctx:
        return PLANNING[index]
    if "Write check(trajectory)" in ctx:
        return VERIFIERS[index]
    if reply == "":
        return EXECUTION_FIRST[index]
    if reply.startswith("Loop."):
        return "Again.\n```python\nprint(1)\n```\n"
    if reply.startswith("Compute."):
        return "So the answer is \\boxed{42}."
    if reply.startswith("Crash."):
        return "Then \\boxed{41}."
    raise AssertionError(f"unexpected context {reply!r}")


class IndexedEngine(ScriptedEngine):
    """Sample index = position within each call for execution contexts (all samples share a prompt)."""

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls += 1
        from unifiedplayers.rollout.types import flatten_segments

        return [[self._complete(flatten_segments(ctx)[0], i, max_new_tokens, stop)] for i, ctx in enumerate(contexts)]


def test_malformed_outputs_are_recorded_failures(tmp_path):
    cfg = compose([
        "experiment=tiny", "schedule.execution_updates=0", "schedule.evaluation_updates=0",
        "perturbation=none", "player.num_trajectories=5", "player.num_verifiers=3", "player.tasks_per_prompt=2",
        "player.planning.response_prefix=", "player.evaluation.response_prefix=", "player.evaluation.stop=[]",
        "player.planning_max_new_tokens=200", "player.execution_max_new_tokens=200",
        "player.evaluation_max_new_tokens=200", "sandbox.timeout_s=1",
    ])
    loop = OuterLoop(cfg, tmp_path, rollout_factory=lambda rc, model, tok: IndexedEngine(tok, respond))
    loop.run()
    played, malformed = load_records(tmp_path / "records.jsonl")
    assert malformed.meta["status"] == "malformed_task" and malformed.meta["reason"] == "no \\boxed{} answer"
    assert malformed.rewards["planning"] == cfg.reward.malformed_task_reward and malformed.trajectories == []
    assert malformed.meta["planning_output"] == PLANNING[1]

    assert played.meta["status"] == "played" and played.question == TASK and played.expected_answer == "42"
    assert played.meta["trajectory_status"] == ["no_answer", "error", "turn_limit", "answered", "answered"]
    assert played.meta["trajectory_detail"][1] == "unterminated_code_block"
    assert played.meta["tool_calls"] == [0, 0, 1, 1, 1]
    assert [t.final_answer for t in played.trajectories] == [None, None, None, "42", "41"]
    assert "ZeroDivisionError" in played.trajectories[4].steps[2].result
    # the looping check timed out on every original: invalid at run time, no row in Z
    assert played.valid == [0] and played.num_generated == 3 and list(played.runtime_invalid) == [2]
    assert "timeout" in played.runtime_invalid[2]
    validity = played.meta["verifier_validity"]
    assert validity[0] == "valid" and validity[1].startswith("does not compile")
    assert played.z_orig.tolist() == [[0, 0, 0, 1, 0]]
    assert len(played.meta["check_errors"]) == 5  # the looping verifier's five timeouts, with their kind
    assert {e["kind"] for e in played.meta["check_errors"]} == {"timeout"}
    assert np.allclose(played.rewards["execution"], [0, 0, 0, 1, 0])
    assert played.rewards["evaluation"][1] == played.rewards["evaluation"][2] == cfg.reward.invalid_verifier_reward

    [m] = read_metrics(tmp_path)
    assert m["planning/valid_rate"] == 0.5 and m["planning/skipped"] == 0.0
    assert m["execution/turn_limit_rate"] == pytest.approx(0.2) and m["execution/error_rate"] == pytest.approx(0.2)
    assert m["evaluation/valid_rate"] == pytest.approx(1 / 3)
    # the looping verifier: invalid at run time (1 of 3 generated), its 5 timeouts kept apart from rejections;
    # the valid verifier's 5 checks (P = 0) returned verdicts, so no error is left in the checks behind Z
    assert m["evaluation/runtime_invalid_rate"] == pytest.approx(1 / 3)
    assert m["evaluation/errors_timeout"] == 5 and m["evaluation/errors_raised"] == 0
    assert m["evaluation/check_error_rate"] == 0.0
    assert "timeout" in validity[2]  # the record says why it is invalid
    # the Planning group (one valid task, one malformed) had different rewards: a real update happened
    assert m["planning/grad_norm"] > 0


def test_no_well_formed_task_skips_the_update_and_records_everything(tmp_path):
    cfg = compose(["experiment=tiny", "schedule.planning_updates=0", "schedule.evaluation_updates=0",
                   "player.planning.response_prefix=", "player.task_attempts=2"])
    loop = OuterLoop(cfg, tmp_path, rollout_factory=lambda rc, model, tok: IndexedEngine(tok, lambda c, i: "no task"))
    loop.run()
    records = load_records(tmp_path / "records.jsonl")
    assert len(records) == 2 * 2 and all(r.meta["status"] == "malformed_task" for r in records)  # 2 attempts x G_T
    [m] = read_metrics(tmp_path)
    assert m["execution/skipped"] == 1.0 and m["planning/valid_rate"] == 0.0
    assert loop.players["execution"].trainer.global_step == 0
