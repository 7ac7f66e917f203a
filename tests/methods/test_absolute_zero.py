"""Absolute Zero's defining mechanisms, each against numbers worked out by hand (AZR, paper/absolute_zero_*):
the learnability reward (Eq. 4), the composite format-aware reward of both roles, induction with held-out
pairs, a solver without tools, picklable answer checks, unknown task types, and the shared model."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from unifiedplayers.config import compose
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import build_method, reward_source
from unifiedplayers.methods import absolute_zero as azr
from unifiedplayers.players.planning import PlanningTask
from unifiedplayers.sandbox import Sandbox, SandboxConfig
from tests.players.scripted import ScriptedEngine  # noqa: E402

pytestmark = pytest.mark.cpu

# f(x) = 3x with four distinct inputs (and a repeat of 4, which must not count as a fifth pair)
TRIPLE = ("```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n```input\n5\n```\n```input\n4\n```\n"
          "```input\n6\n```\n```input\n7\n```\n```message\nmultiplies by a constant\n```")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=5.0)) as sb:
        yield sb


def build(topic, sandbox, text=TRIPLE):
    return azr.build_code_task(PlanningTask(text, None, None, False, "", topic=topic), sandbox)


def feedback(answers, task):
    return TaskFeedback(SimpleNamespace(), answers, None, expected_answer=task.expected_answer,
                        answer_check=task.check)


def test_learnability_reward_against_azr_eq4(sandbox):
    # AZR Eq. 4: r_propose = 1 − r̄_solve if 0 < r̄_solve < 1, else 0, with r̄_solve the mean of n solver rollouts.
    # Deduction f(4) = 12, n = 4 rollouts:
    #   1 of 4 right: r̄ = 0.25 -> 0.75;  3 of 4: r̄ = 0.75 -> 0.25;  4 of 4: r̄ = 1 -> 0;  0 of 4: r̄ = 0 -> 0.
    ded = build("deduction", sandbox)
    cases = {("12", "11", "13", None): (0.75, [1, 0, 0, 0]), ("12", "12.0", "12", "1 2"): (0.25, [1, 1, 1, 0]),
             ("12",) * 4: (0.0, [1, 1, 1, 1]), ("3", None, "x", "[12]"): (0.0, [0, 0, 0, 0])}
    for answers, (r_prop, solved) in cases.items():
        f = feedback(list(answers), ded)
        assert reward_source("execution", "expected_answer")(f).tolist() == solved  # AZR Eq. 5: binary
        assert reward_source("planning", "learnability")(f) == pytest.approx(r_prop)
    # AZR compares by Python value equality: 12.0 == 12, but the string '12' is not the integer 12
    assert azr.outputs_equal("12", "12.0") and not azr.outputs_equal("12", "'12'")
    assert [azr.learnability_reward(s) for s in (0.0, 0.125, 0.5, 1.0)] == [0.0, 0.875, 0.5, 0.0]


def test_composite_reward_of_the_solver_by_hand(sandbox):
    # AZR's composite reward: r_role if well formatted and passable, -0.5 if well formatted but wrong, -1 on a
    # format error. Solver: r_solve = 1 when correct; no \boxed{} answer (final_answer None) is the format error.
    assert [azr.composite_reward(1.0, True, True), azr.composite_reward(1.0, True, False),
            azr.composite_reward(1.0, False, False)] == [1.0, -0.5, -1.0]
    ded = build("deduction", sandbox)  # f(4) = 12
    f = feedback(["12", "11", None, "12.0"], ded)
    #   "12" right: 1;  "11" answered, wrong: -0.5;  None, no answer: -1;  "12.0" right (12.0 == 12): 1
    assert reward_source("execution", "azr_composite")(f).tolist() == [1.0, -0.5, -1.0, 1.0]
    assert reward_source("execution", "expected_answer")(f).tolist() == [1.0, 0.0, 0.0, 1.0]  # r_solve alone
    # the proposer's learnability reads correctness only (2 of 4 solved: 1 - 0.5), never the penalties
    assert reward_source("planning", "learnability")(f) == pytest.approx(0.5)
    # induction, checked by execution on every pair: a lookup table is an answer (-0.5), "12" too (no f in it)
    ind = build("induction", sandbox)
    f = feedback(["lambda x: 3 * x", "lambda x: {4: 12, 5: 15}[x]", "12", None], ind)
    assert reward_source("execution", "azr_composite")(f).tolist() == [1.0, -0.5, -0.5, -1.0]
    # GRPO sees the three levels: mean 0 over (1, -0.5, -0.5, -1) -> no-answer below wrong below right
    rewards = reward_source("execution", "azr_composite")(f)
    assert rewards.mean() == pytest.approx(-0.25)


# Proposer outputs, by what the composite reward makes of them (topic deduction unless said):
NO_BLOCK = "I cannot think of a function."  # nothing parses: format error
NO_INPUT = "```python\ndef f(x):\n    return x\n```\n"  # a program but no ```input block: format error
UNCLOSED = "```python\ndef f(x):\n    return x\n```\n```input\n4\n"  # the input fence never closes
SYNTAX = "```python\ndef f(x) return x\n```\n```input\n4\n```"  # parses as a proposal; fails validation
RANDOM = "```python\nimport random\ndef f(x):\n    return random.random()\n```\n```input\n4\n```"
NOT_LITERAL = "```python\ndef f(x):\n    return x\n```\n```input\nfour\n```"
RAISES = "```python\ndef f(x):\n    return 1 // 0\n```\n```input\n4\n```"
VALID = "```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```"


@pytest.mark.parametrize("text, topic, reward", [
    (NO_BLOCK, "deduction", -1.0), (NO_INPUT, "deduction", -1.0), (UNCLOSED, "abduction", -1.0),
    (SYNTAX, "deduction", -1.0), (RANDOM, "deduction", -1.0), (NOT_LITERAL, "abduction", -1.0),
    (RAISES, "deduction", -1.0),
    ("```python\ndef f(x):\n    return x\n```\n```input\n1\n```\n```input\n1\n```", "induction", -1.0),
])
def test_composite_reward_of_a_malformed_proposal_by_hand(sandbox, text, topic, reward):
    # AZR §3.1: only valid triplets that pass the filtering stage are correctly formatted, so every invalid
    # proposal is a format error, -1: unreadable (no program or input) and read but failing validation alike
    task = build(topic, sandbox, text)
    assert not task.valid
    assert azr.proposal_reward(task) == reward
    method = build_method(compose(["method=absolute_zero"]))
    assert method.malformed_task_reward(task) == reward  # the hook the phase reads for unplayed outputs


def test_composite_reward_of_a_valid_proposal_is_its_learnability(sandbox):
    task = build("deduction", sandbox, VALID)
    assert task.valid
    # K = 4 solver answers to f(4) = 12: one right -> r_solve mean 0.25 -> r_propose = 0.75
    f = feedback(["12", "13", None, "4"], task)
    r_propose = reward_source("planning", "learnability")(f)
    assert r_propose == pytest.approx(0.75) and azr.proposal_reward(task, r_propose) == pytest.approx(0.75)
    assert reward_source("planning", "azr_composite")(f) == pytest.approx(0.75)
    # all four right (learnability 0) or none: well formatted, not passable, -0.5 (AZR's reward manager:
    # format ok and accuracy reward 0 -> -0.5)
    for answers in (["12"] * 4, ["13", None, "4", "11"]):
        fb = feedback(answers, task)
        assert reward_source("planning", "learnability")(fb) == 0.0
        assert reward_source("planning", "azr_composite")(fb) == -0.5 and azr.proposal_reward(task, 0.0) == -0.5
    with pytest.raises(ValueError, match="learnability"):
        azr.proposal_reward(task)


def test_the_preset_trains_both_roles_on_the_composite_reward():
    cfg = compose(["method=absolute_zero"])
    assert cfg.method.execution_reward == "azr_composite" and cfg.method.planning_reward == "azr_composite"
    assert cfg.method.shared_model is True
    # a math-format run (Planning tasks with a boxed answer) keeps the configured malformed reward
    math = azr.AbsoluteZero(compose(["method=absolute_zero", "method.extra.task_format=math",
                                     "reward.malformed_task_reward=-0.25"]))
    assert math.malformed_task_reward(PlanningTask("x", None, None, False, "no \\boxed{} answer")) == -0.25
    # and so does every other method (the default hook)
    up = build_method(compose(["reward.malformed_task_reward=-0.75"]))
    assert up.malformed_task_reward(PlanningTask("x", None, None, False, "no \\boxed{} answer")) == -0.75


def test_induction_shows_half_and_checks_all_so_a_lookup_table_fails(sandbox):
    ind = build("induction", sandbox)
    # distinct inputs 4, 5, 6, 7 (the repeated 4 dropped): the first half (4, 5) shown, all four checked
    assert ind.valid and ind.check.pairs == (("4", "12"), ("5", "15"), ("6", "18"), ("7", "21"))
    assert "f(4) = 12\nf(5) = 15\n" in ind.question and "f(6)" not in ind.question and "f(7)" not in ind.question
    assert "Hint: multiplies by a constant" in ind.question  # AZR's message m
    table = "lambda x: {4: 12, 5: 15}[x]"  # reproduces every shown pair ...
    assert azr.check_induction(ind.check.sandbox, azr.induction_program(table), ind.check.pairs[:2])
    assert not ind.check(table)  # ... and fails on the hidden 6 and 7
    assert not ind.check("lambda x: {4: 12, 5: 15, 6: 18}.get(x, 0)")  # misses 7 -> 21
    assert ind.check("lambda x: 3 * x") and ind.check("def f(x):\n    return x + x + x")
    assert not ind.check("12") and not ind.check(None)
    # rewards on a group of four: 2 of 4 generalise -> r̄ = 0.5 -> learnability 0.5
    f = feedback(["lambda x: 3*x", table, "lambda x: x * 3", None], ind)
    assert reward_source("execution", "expected_answer")(f).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert reward_source("planning", "learnability")(f) == 0.5
    one = "```python\ndef f(x):\n    return x\n```\n```input\n1\n```\n```input\n1\n```"
    assert build("induction", sandbox, one).reason.startswith("induction needs at least 2 distinct")


def test_unknown_task_type_is_an_error(sandbox):
    with pytest.raises(ValueError, match="no task types"):
        build("geometry", sandbox)
    with pytest.raises(ValueError, match="no task types"):
        azr.check_task_types(["deduction", "riddle"])
    azr.check_task_types(list(azr.TASK_TYPES))
    with pytest.raises(ValueError, match="task type"):
        azr.AnswerCheck("riddle")


def test_answer_checks_pickle_without_their_sandbox(sandbox):
    tasks = [build(t, sandbox) for t in azr.TASK_TYPES]
    copies = pickle.loads(pickle.dumps(tasks))  # what DistContext.broadcast does to them
    for task, copy in zip(tasks, copies):
        assert copy.check == task.check and copy.check.sandbox is None
    ded, abd, ind = copies
    assert ded.check("12") and not ded.check("13")  # deduction runs no code
    with pytest.raises(RuntimeError, match="bind"):
        abd.check("4")
    assert abd.check.bind(sandbox)("4") and not abd.check("5")
    assert ind.check.bind(sandbox)("lambda x: 3 * x")


def test_the_solver_has_no_tools_and_copied_code_gets_no_answer(sandbox, tmp_path):
    from unifiedplayers.models import build_byte_tokenizer
    from unifiedplayers.players.execution import execution_prompt, solve
    from unifiedplayers.loop.outer import OuterLoop

    # room for the scripted replies in byte tokens (the tiny preset allows 16)
    cfg = compose(["experiment=tiny", "method=absolute_zero", "player.execution_max_new_tokens=256", "player.topics=[deduction]"])
    assert not cfg.method.use_tools
    loop = OuterLoop(cfg, tmp_path)
    assert loop.execution_cfg.max_turns == 1  # one generation: code in it is never run
    ded = build("deduction", sandbox)
    tok = build_byte_tokenizer()
    prompt = execution_prompt(tok, loop.execution_cfg, ded.question)
    # the task shows f (that is the puzzle), but nothing offers a tool: no "prints", no output block
    assert "```python\ndef f(x)" in prompt
    for offer in ("```output", "print", "Write a ```python", "output is shown"):
        assert offer not in prompt, offer
    assert "without running" in prompt
    copy_and_run = "```python\ndef f(x):\n    return x * 3\nprint(f(4))\n```\n"
    reasoned = "f multiplies 4 by 3, which is 12. \\boxed{12}"
    replies = iter([copy_and_run, reasoned])  # the loop asks for each sample in turn (n = 1 per context)
    # the engine stops before the closing fence "```\n" (a stop string); the loop asks to go on, and gets it
    engine = ScriptedEngine(tok, lambda ctx, j: "```\n" if ctx.endswith("print(f(4))\n") else next(replies))
    (rollouts,) = solve(engine, sandbox, tok, loop.execution_cfg, [ded.question], 2)
    copied, thought = rollouts
    # the code was not run: no tool call, no observation, no answer (status turn_limit: code in the last turn)
    assert copied.num_tool_calls == 0 and copied.observations == [] and copied.final_answer is None
    assert copied.status == "turn_limit"
    assert thought.final_answer == "12" and thought.status == "answered"
    f = feedback([r.final_answer for r in rollouts], ded)
    assert reward_source("execution", "expected_answer")(f).tolist() == [0.0, 1.0]


def test_shared_model_option(tmp_path):
    # one model for both roles by default (both papers); two players from the same backbone as an option
    method = compose(["method=absolute_zero"]).method
    assert azr.shared_model(method) is True
    assert build_method(compose(["method=absolute_zero"])).shared_model is True
    off = compose(["method=absolute_zero", "method.shared_model=false"])
    assert azr.shared_model(off.method) is False and build_method(off).shared_model is False
    with pytest.raises(ValueError, match="true or false"):
        azr.shared_model(SimpleNamespace(shared_model="yes"))
    alone = compose(["method=absolute_zero", "method.roles=[execution]"])  # shared by default
    with pytest.raises(ValueError, match="does not train both"):
        build_method(alone)
    build_method(compose(["method=absolute_zero", "method.shared_model=false", "method.roles=[execution]"]))
    from unifiedplayers.loop.outer import OuterLoop

    with pytest.raises(ValueError, match="schedule.feedback=stale"):
        OuterLoop(compose(["experiment=tiny", "method=absolute_zero", "player.topics=[deduction]",
                           "schedule.feedback=stale"]), tmp_path)

def test_a_shared_model_is_one_set_of_weights_stepped_by_both_blocks(tmp_path):
    """method.shared_model=true (AZR: one model proposes and solves): the Planning and Execution players are
    one model with one trainer; the Planning block's 2 steps and the Execution block's 2 steps all move it,
    both roles' checkpoints and versions name it, and a resumed run ends with the same weights."""
    import torch

    from unifiedplayers.loop.outer import OuterLoop

    overrides = ["experiment=tiny", "method=absolute_zero", "method.shared_model=true", "player.topics=[deduction]",
                 "schedule.planning_updates=2", "schedule.execution_updates=2",
                 "player.planning.response_prefix='```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n'"]
    loop = OuterLoop(compose(overrides), tmp_path / "a")
    loop.run()
    planning, execution = loop.players["planning"], loop.players["execution"]
    assert planning.model is execution.model and planning.trainer is execution.trainer
    assert planning.trainer.global_step == 4  # 2 Planning + 2 Execution optimizer steps on the same weights
    assert planning.version == execution.version == {"player": "execution", "outer_iteration": 1, "step": 4}
    saved = torch.load(tmp_path / "a" / "checkpoints" / "iter1" / "execution" / "model.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in execution.model.state_dict().items())

    def stop_after_planning(event, loop, slot):
        if event == "block_end" and slot.role == "planning":
            raise RuntimeError("stopped between the blocks")

    with pytest.raises(RuntimeError):
        OuterLoop(compose(overrides), tmp_path / "b", hooks=[stop_after_planning]).run()
    resumed = OuterLoop(compose(overrides + ["resume=true"]), tmp_path / "b")
    resumed.run()
    a, b = execution.model.state_dict(), resumed.players["execution"].model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "records.jsonl").read_text() == (tmp_path / "b" / "records.jsonl").read_text()


def test_the_loop_trains_the_proposer_on_the_composite_reward(tmp_path):
    """One tiny Planning block of three scripted proposals (G_T = 3) and K = 2 scripted solutions: the
    Planning group's rewards are the composite reward of each output, in the GRPO batch's group and in the
    records. Valid f(x) = 3x on 4: the solver answers 12 (right) and 13 (wrong): r̄_solve = 0.5, r_propose =
    1 − 0.5 = 0.5. A syntax error: an invalid proposal, a format error for AZR's proposer, −1. Valid
    f(x) = x + 1 on 4 (= 5): the solver answers 12 and 13, both wrong: learnability 0, so −0.5."""
    import itertools

    from unifiedplayers.diagnostics.logging import read_metrics
    from unifiedplayers.loop.outer import OuterLoop
    from unifiedplayers.diagnostics.records import load_records

    plus_one = "```python\ndef f(x):\n    return x + 1\n```\n```input\n4\n```"
    proposals = [VALID, SYNTAX, plus_one]
    solutions = itertools.cycle(["f(4) = 4 * 3 = 12. \\boxed{12}", "f(4) = 13. \\boxed{13}"])

    def respond(ctx, j):
        turn = ctx.rsplit("<|im_start|>user", 1)[-1]
        if "Write a function f and inputs" in turn:
            return proposals[j % 3]  # the G_T samples of one prompt: j = 0, 1, 2
        if "What does f return" in turn:
            return next(solutions)  # the K samples come one context at a time (n = 1): right, wrong, ...
        raise AssertionError(f"unexpected context {turn!r}")

    cfg = compose(["experiment=tiny", "method=absolute_zero", "player.topics=[deduction]",
                   "player.tasks_per_prompt=3", "player.planning_max_new_tokens=200",
                   "player.execution_max_new_tokens=200"])
    loop = OuterLoop(cfg, tmp_path, rollout_factory=lambda rc, model, tok: ScriptedEngine(tok, respond))
    loop.run()
    planning = [r for r in load_records(tmp_path / "records.jsonl") if r.meta["block"] == "planning"]
    got = {r.meta["planning_output"]: r.rewards for r in planning}
    assert got[VALID]["planning"] == pytest.approx(0.5) and got[VALID]["execution"] == [1.0, -0.5]
    assert got[SYNTAX]["planning"] == -1.0 and got[plus_one]["planning"] == -0.5
    assert got[plus_one]["execution"] == [-0.5, -0.5]  # answered, wrong
    first = next(m for m in read_metrics(tmp_path) if m["block"] == "planning")
    assert first["planning/reward_mean"] == pytest.approx((0.5 - 1.0 - 0.5) / 3)
