"""Baselines as compositions (§4.1, Appendix G.1): their reward functions by hand, Absolute Zero's sandbox validation,
Socratic-Zero's start-up check and Teacher client, and one tiny outer iteration of each trainable method."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import build_method, reward_source
from unifiedplayers.methods import absolute_zero as azr
from unifiedplayers.methods import socratic_zero
from unifiedplayers.diagnostics.records import load_records
from unifiedplayers.sandbox import Sandbox, SandboxConfig
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.schedule import trained_roles

from tests.methods.stub_teacher import serve_teacher

pytestmark = pytest.mark.cpu


def fb(answers, *, u=0.0, rep=0.0, tool_calls=(), expected=None, method=None, question="q", settings=None):
    rewards = SimpleNamespace(uncertainty=u, repetition=rep)
    return TaskFeedback(rewards, answers, SimpleNamespace(w_unc=1.0, w_rep=0.5), tool_calls=tool_calls,
                        expected_answer=expected, question=question, method_cfg=method, settings=settings)


# ------------------------------------------------------------------ Absolute Zero


def test_learnability_reward_by_hand():
    assert azr.learnability_reward(0.0) == 0.0 and azr.learnability_reward(1.0) == 0.0
    assert azr.learnability_reward(0.25) == 0.75
    with pytest.raises(ValueError):
        azr.learnability_reward(1.5)
    # two of four samples match the sandbox's output [1, 2] (literal comparison ignores spacing)
    f = fb(["[1,2]", "[1, 2]", "[2, 1]", None], expected="[1, 2]")
    assert reward_source("execution", "expected_answer")(f).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert reward_source("planning", "learnability")(f) == 0.5
    assert reward_source("planning", "learnability")(fb(["3", "3"], expected="3")) == 0.0  # solved by all
    with pytest.raises(ValueError, match="no expected answer"):
        reward_source("execution", "expected_answer")(fb(["3"]))


def test_static_check():
    assert azr.static_check("def f(x):\n    return x + 1\n") is None
    assert "syntax error" in azr.static_check("def f(x) return x")
    assert azr.static_check("def g(x):\n    return x\n") == "no top-level function f"
    assert "random" in azr.static_check("import random\ndef f(x):\n    return random.random()\n")
    assert "time" in azr.static_check("def f(x):\n    from time import time\n    return time()\n")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=5.0)) as sb:
        yield sb


def test_validate_and_check_tasks_in_the_sandbox(sandbox):
    prog = "def f(xs):\n    return sorted(set(xs))[:2]\n"
    ok = azr.validate_proposal(sandbox, prog, "[3, 1, 3, 2]")
    assert ok.valid and ok.output == "[1, 2]"
    assert azr.check_deduction(ok.output, "[1,2]") and not azr.check_deduction(ok.output, "[1, 3]")
    # abduction: any input whose output matches counts
    assert azr.check_abduction(sandbox, prog, "[2, 1]", "[1, 2]")
    assert not azr.check_abduction(sandbox, prog, "[5, 6]", "[1, 2]")
    assert not azr.check_abduction(sandbox, prog, None, "[1, 2]")
    # induction: the predicted program must reproduce every pair
    pairs = [("2", "4"), ("5", "10")]
    assert azr.check_induction(sandbox, "def f(x):\n    return x * 2\n", pairs)
    assert not azr.check_induction(sandbox, "def f(x):\n    return x + 2\n", pairs)
    # rejected proposals, each with its reason
    assert "ZeroDivisionError" in azr.validate_proposal(sandbox, "def f(x):\n    return 1 / x\n", "0").reason
    assert "not a Python literal" in azr.validate_proposal(sandbox, prog, "open('x')").reason
    nondet = "def f(n):\n    return __import__('os').urandom(n).hex()\n"  # passes the static check, not the runs
    assert azr.validate_proposal(sandbox, nondet, "50").reason.startswith("nondeterministic")
    assert "timed out" in azr.validate_proposal(sandbox, "def f(x):\n    while True:\n        pass\n", "1").reason


def test_code_tasks_from_proposals(sandbox):
    from unifiedplayers.players.planning import PlanningTask

    text = ("```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n```input\n5\n```\n"
            "```input\n6\n```\n```input\n7\n```")
    assert azr.parse_proposal(text) == ("def f(x):\n    return x * 3\n", ["4", "5", "6", "7"])

    def build(topic, t=text):
        return azr.build_code_task(PlanningTask(t, None, None, False, "no \\boxed{} answer", topic=topic), sandbox)

    ded = build("deduction")
    assert ded.valid and ded.expected_answer == "12" and "Input: 4" in ded.question
    assert ded.check("12") and not ded.check("13")
    abd = build("abduction")
    assert abd.valid and "returns 12" in abd.question and abd.check("4") and not abd.check("5")
    ind = build("induction")  # AZR: the first half of the pairs shown, all checked (tests/methods/test_absolute_zero.py)
    assert "f(4) = 12" in ind.question and "f(5) = 15" in ind.question and "f(6)" not in ind.question
    assert ind.check("lambda x: 3 * x") and not ind.check("lambda x: x + 8") and not ind.check("12")
    assert build("deduction", "no code here").reason == "no ```python block with f"
    bad = build("deduction", "```python\nimport random\ndef f(x):\n    return random.random()\n```\n```input\n1\n```")
    assert not bad.valid and "nondeterministic" in bad.reason
    # the reward sources use the task's execution check
    f = TaskFeedback(SimpleNamespace(), ["4", "9", None, "4"], None, expected_answer=abd.expected_answer,
                     answer_check=abd.check)
    assert reward_source("execution", "expected_answer")(f).tolist() == [1.0, 0.0, 0.0, 1.0]
    assert reward_source("planning", "learnability")(f) == 0.5


# ------------------------------------------------------------------ Socratic-Zero


def test_socratic_zero_stops_at_start_up_without_a_teacher():
    cfg = compose(["method=socratic_zero"])
    with pytest.raises(ValueError, match="method.extra.teacher_endpoint"):
        build_method(cfg)
    # nothing else is affected: the default method still starts
    assert build_method(compose([]))


def test_parse_grade():
    assert socratic_zero.parse_grade("CORRECT") == 1.0
    assert socratic_zero.parse_grade("Incorrect.") == 0.0
    with pytest.raises(ValueError, match="neither"):
        socratic_zero.parse_grade("maybe")


def teacher_reply(prompt: str) -> str:
    """An OpenAI-compatible endpoint that says CORRECT exactly for the answer 42."""
    return "CORRECT" if "final answer: 42\n" in prompt else "INCORRECT"


@pytest.fixture()
def stub():
    with serve_teacher(teacher_reply) as teacher:
        yield teacher


@pytest.fixture()
def teacher_url(stub):
    return stub.url


def test_teacher_grades_through_the_endpoint(stub, teacher_url, monkeypatch):
    monkeypatch.setenv("TEST_TEACHER_KEY", "secret")
    method = SimpleNamespace(name="socratic_zero", extra={"teacher_endpoint": teacher_url, "teacher_model": "judge"})
    settings = socratic_zero.SocraticSettings(teacher_endpoint=teacher_url, teacher_model="judge",
                                              api_key_env="TEST_TEACHER_KEY")
    got = reward_source("execution", "teacher")(fb(["42", "41", None], method=method, question="6*7?",
                                                   settings=settings))
    assert got.tolist() == [1.0, 0.0, 0.0]
    assert stub.seen[-1][:3] == ("/v1/chat/completions", "judge", "Bearer secret")
    assert len(stub.seen) >= 2  # the missing answer was not sent


# ------------------------------------------------------------------ compositions on the engine


def test_method_configs_compose_to_their_roles():
    roles = {m: trained_roles(compose([f"method={m}"])) for m in
             ["unifiedplayers", "vanilla", "tool_augmented", "agent0", "r_zero", "absolute_zero", "socratic_zero"]}
    assert roles["unifiedplayers"] == ["planning", "execution", "evaluation"]
    assert roles["vanilla"] == roles["tool_augmented"] == []
    assert all(roles[m] == ["planning", "execution"] for m in ["agent0", "r_zero", "absolute_zero", "socratic_zero"])
    rz = compose(["method=r_zero"])
    assert rz.reward.repetition_mode == "cluster_share" and not rz.method.use_tools
    assert "Python" not in rz.player.execution.system


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("method,extra", [
    ("agent0", []),
    ("r_zero", []),
    ("socratic_zero", ["method.extra.teacher_model=judge"]),
    ("absolute_zero", ["player.planning.response_prefix='```python\ndef f(x):\n    return x * 3\n```\n```input\n4\n```\n'",
                       "player.topics=[deduction]"]),  # the tiny preset's math topics are no AZR task types
])
def test_one_tiny_outer_iteration(method, extra, tmp_path, teacher_url):
    torch.set_num_threads(1)
    overrides = ["experiment=tiny", f"method={method}", *extra]
    if method == "socratic_zero":
        overrides.append(f"method.extra.teacher_endpoint={teacher_url}")
    cfg = compose(overrides)
    snaps = {}

    def hook(event, loop, slot):
        if event == "block_end":
            snaps[slot.role] = {r: _weights(p.model) for r, p in loop.players.items()}
    loop = OuterLoop(cfg, tmp_path, hooks=[hook])
    start = {r: _weights(p.model) for r, p in loop.players.items()} if loop.players else None
    loop.run()
    metrics = read_metrics(tmp_path)
    assert [m["block"] for m in metrics] == ["planning", "execution"]  # no Evaluation block
    assert loop.players["evaluation"].trainer is None
    records = load_records(tmp_path / "records.jsonl")
    played = [r for r in records if r.trajectories]
    assert played
    if method in ("agent0", "r_zero", "absolute_zero"):  # verdict-free: no verifier was written
        assert not cfg.method.verifiers and all(not r.verifiers and r.num_generated == 0 for r in played)
    for rec in played:
        answers = [t.final_answer for t in rec.trajectories]
        rs = np.asarray(rec.rewards["execution"])
        if method in ("agent0", "r_zero"):  # majority-vote pseudo-labels
            expected = np.asarray(reward_source("execution", "majority_vote")(fb(answers)))
        elif method == "absolute_zero":  # proposals validated in the sandbox: f(4) = 12 (deduction first)
            assert rec.expected_answer == "12" and "What does f return" in rec.question
            # AZR's composite reward (azr_composite): 1 right, -0.5 answered but wrong, -1 no \boxed{} answer
            expected = np.array([1.0 if azr.outputs_equal(a, "12") else (-1.0 if a is None else -0.5)
                                 for a in answers])
        else:  # the Teacher says CORRECT only for 42
            expected = np.array([float(a == "42") for a in answers])
        assert rs.tolist() == expected.tolist()
    if method == "r_zero":  # no tools: one generation per trajectory, code never run
        assert all(n == 0 for rec in played for n in rec.meta["tool_calls"])
    if method in ("agent0", "r_zero"):  # the Solver/Executor trains only on tasks inside its p̂ band
        ex_played = [r for r in played if r.meta["block"] == "execution"]
        keep = [loop.method.group_shape("execution", fb([t.final_answer for t in r.trajectories]), 0.2).keep
                for r in ex_played]
        assert metrics[1]["execution/kept_groups"] == sum(keep) / len(keep)
        if not any(keep):
            assert metrics[1]["execution/skipped"] == 1.0
    # the Evaluation player never moves; the Execution player did in its block
    ev_after = snaps["execution"]["evaluation"]
    assert start is None or all(torch.equal(ev_after[k], v) for k, v in start["evaluation"].items())


def test_use_tools_false_gives_one_generation_per_trajectory(tmp_path):
    """Methods without tools (R-Zero, Socratic-Zero): the tool loop gets one turn, so code is never run."""
    with_tools = OuterLoop(compose(["experiment=tiny", "method=agent0"]), tmp_path / "a")
    without = OuterLoop(compose(["experiment=tiny", "method=r_zero"]), tmp_path / "b")
    assert with_tools.execution_cfg.max_turns == 2 and without.execution_cfg.max_turns == 1
    assert without.cfg.player.max_turns == 2  # the config itself is left as composed
    from unifiedplayers.players.planning import PlanningTask

    # Agent0 keeps the Planning player's math task as it is; Absolute Zero turns the proposal into a code task
    proposal = PlanningTask("no code here", "q?", "1", True, "", topic="deduction")
    assert with_tools.method.build_task(proposal, None) is proposal
    azr_loop = OuterLoop(compose(["experiment=tiny", "method=absolute_zero", "player.topics=[deduction]"]),
                         tmp_path / "c")
    assert isinstance(azr_loop.method, azr.AbsoluteZero) and azr_loop.method.settings.task_format == "code_reasoning"
    built = azr_loop.method.build_task(proposal, None)
    assert not built.valid and built.reason == "no ```python block with f"
    with pytest.raises(ValueError, match="task_format"):
        OuterLoop(compose(["experiment=tiny", "+method.extra.task_format=nope"]), tmp_path / "d")
    with pytest.raises(ValueError, match="task_format"):
        OuterLoop(compose(["experiment=tiny", "method=absolute_zero", "player.topics=[deduction]",
                           "method.extra.task_format=nope"]), tmp_path / "e")


def test_a_verdict_free_method_cannot_train_on_verdicts():
    with pytest.raises(ValueError, match="execution_reward=verdict"):
        build_method(compose(["method=r_zero", "method.execution_reward=verdict"]))
    assert build_method(compose(["method=r_zero"]))  # its own composition is fine
