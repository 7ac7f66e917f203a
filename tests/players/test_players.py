"""The three players' prompts and parsers (no model: byte tokenizer and a scripted engine)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from unifiedplayers.config import compose
from unifiedplayers.feedback.pipeline import TaskFeedback
from unifiedplayers.methods import REWARD_SOURCES, build_method, reward_source
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players import (evaluation_prompt, execution_prompt, generate_tasks, parse_task, planning_prompt,
                                    render_prompt, topic_at, write_verifiers)
from unifiedplayers.feedback.rewards import TaskRewards
from unifiedplayers.feedback.trajectory import TRAJECTORY_SCHEMA
from unifiedplayers.feedback.verifier import compile_verifier
from tests.players.scripted import ScriptedEngine  # noqa: E402

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.fixture(scope="module")
def cfg():
    return compose([])


# ---------------------------------------------------------------- Planning: parsing


@pytest.mark.parametrize("text,question,answer", [
    ("A book costs 12 dollars and a pen 3. How much do 2 books and a pen cost?\nAnswer: \\boxed{27}",
     "A book costs 12 dollars and a pen 3. How much do 2 books and a pen cost?", "27"),
    ("Problem: Sam has 5 apples and eats 2 of them. How many are left? The answer is \\boxed{3}.",
     "Sam has 5 apples and eats 2 of them. How many are left?", "3"),
    ("**Question:** What is one half of the sum 7 + 9 + 4?\n\n**Answer:** \\boxed{\\frac{20}{2}}",
     "What is one half of the sum 7 + 9 + 4?", "\\frac{20}{2}"),
])
def test_parse_task_splits_question_and_answer(text, question, answer):
    t = parse_task(text)
    assert t.valid, t.reason
    assert t.question == question and t.expected_answer == answer
    assert "boxed" not in t.question and answer not in t.question.split()[-1]


@pytest.mark.parametrize("text,reason", [
    ("How many apples are there in three boxes of twelve?", "no \\boxed{} answer"),
    ("How many apples are there in three boxes? Answer: \\boxed{ }", "empty \\boxed{} answer"),
    ("Tiny? \\boxed{3}", "question shorter than 20 characters"),
    ("What is \\boxed{3} plus one, in this long question? Answer: \\boxed{4}", "a \\boxed{} answer inside the question"),
    ("How many apples are there in three boxes? \\boxed{" + "9" * 80 + "}", "answer longer than 64 characters"),
    ("Unclosed \\boxed{12 in a question that never ends", "no \\boxed{} answer"),
])
def test_parse_task_flags_malformed_outputs(text, reason):
    t = parse_task(text)
    assert not t.valid and t.reason == reason


def test_topics_rotate():
    assert [topic_at(["a", "b", "c"], i) for i in range(5)] == ["a", "b", "c", "a", "b"]
    assert topic_at([], 3) == "any topic"


# ---------------------------------------------------------------- prompts


def test_default_prompts_use_the_chat_template_and_few_shot(tok, cfg):
    p = cfg.player
    plan = planning_prompt(tok, p, "geometry")
    assert plan.startswith("<|im_start|>system\n") and plan.endswith("<|im_start|>assistant\n")
    assert "about geometry." in plan and plan.count("<|im_start|>user") == 1 + len(p.planning.few_shot)
    ex = execution_prompt(tok, p, "What is 6*7?")
    assert "What is 6*7?" in ex and "```python" in ex and "```output" in ex  # the worked example shows the format
    ev = evaluation_prompt(tok, p, "What is 6*7?")
    assert TRAJECTORY_SCHEMA in ev and "What is 6*7?" in ev
    assert ev.endswith("<|im_start|>assistant\n" + p.evaluation.response_prefix)


def test_the_expected_answer_never_reaches_execution_or_evaluation(tok, cfg):
    task = parse_task("Lena reads 12 pages a day for 9 days. How many pages does she read?\nAnswer: \\boxed{108}")
    assert task.valid
    for prompt in (execution_prompt(tok, cfg.player, task.question), evaluation_prompt(tok, cfg.player, task.question)):
        assert task.question in prompt and "108" not in prompt


def test_prompts_are_editable_without_code(tok):
    cfg = compose(["player.planning.template='Invent a puzzle on {topic}!'", "player.planning.few_shot=[]",
                   "player.planning.system=", "player.planning.response_prefix=Puzzle:"])
    assert planning_prompt(tok, cfg.player, "dice").endswith(
        "<|im_start|>user\nInvent a puzzle on dice!<|im_end|>\n<|im_start|>assistant\nPuzzle:")


def test_plain_transcript_without_chat_template(cfg):
    tok = build_byte_tokenizer()
    tok.chat_template = None
    out = render_prompt(tok, cfg.player.execution, question="Q?")
    assert "\nuser: Q?\n" in out and out.endswith("\\boxed{N}.\nassistant: ")


def test_a_bad_few_shot_entry_is_a_clear_error(tok):
    cfg = compose(["player.planning.few_shot=[{user: hi}]"])
    with pytest.raises(ValueError, match="few_shot\\[0\\]"):
        planning_prompt(tok, cfg.player, "x")


# ---------------------------------------------------------------- generation through an engine


def test_generate_tasks_groups_and_flags(tok, cfg):
    outputs = ["Ann has 4 bags of 6 marbles each. How many marbles?\nAnswer: \\boxed{24}\nextra",
               "I cannot think of a problem.",
               "A train goes 50 km/h for 3 hours. How far does it go?\nAnswer: \\boxed{150}"]
    engine = ScriptedEngine(tok, lambda ctx, j: outputs[j])
    groups = generate_tasks(engine, tok, cfg.player, first_prompt=1, num_prompts=2, tasks_per_prompt=3, seed=0)
    assert len(groups) == 2 and all(len(g) == 3 for g in groups)
    assert [g[0].topic for g in groups] == [topic_at(cfg.player.topics, 1), topic_at(cfg.player.topics, 2)]
    assert [t.valid for t in groups[0]] == [True, False, True]
    # the stop string "}\n" ends the first output after its answer line
    assert groups[0][0].expected_answer == "24" and groups[0][0].completion.text.endswith("}\n")
    assert groups[0][1].reason == "no \\boxed{} answer"
    assert [t.prompt_index for t in groups[1]] == [1, 1, 1]


def test_write_verifiers_prepends_the_response_prefix(tok, cfg):
    body = " outputs and answer == '42':\n        return True\n    return (False, 0)\n```\nanything after"
    engine = ScriptedEngine(tok, lambda ctx, j: body if j == 0 else "    return (\n")
    [[good, bad]] = write_verifiers(engine, tok, cfg.player, ["What is 6*7?"], m=2, seed=0)
    assert good.source.startswith(cfg.player.evaluation.response_prefix)
    assert "anything after" not in good.source  # stop string "\n```"
    assert compile_verifier(good.source).valid
    assert not compile_verifier(bad.source).valid


# ---------------------------------------------------------------- reward sources (the method hook)


def _feedback(answers):
    tr = TaskRewards(execution=np.array([0.5, 1.0, 0.0]), evaluation=np.array([0.3, -1.0]), planning=0.7,
                     gold=np.array([0.5]), adv=np.array([0.2]), red=np.array([0.0]), uncertainty=0.4,
                     writability=0.1, repetition=0.2)
    return TaskFeedback(tr, answers, compose([]).reward)


def test_reward_sources_by_method_name():
    fb = _feedback(["4", "4.0", "5"])
    method = build_method(compose([]))
    assert np.allclose(method.source("execution")(fb), [0.5, 1.0, 0.0])
    assert np.allclose(method.source("evaluation")(fb), [0.3, -1.0])
    assert method.source("planning")(fb) == pytest.approx(0.7)
    got = method.phase_rewards([fb, fb])  # every player's rewards of a phase, task by task
    assert [r["execution"].tolist() for r in got] == [[0.5, 1.0, 0.0]] * 2
    assert [r["evaluation"].tolist() for r in got] == [pytest.approx([0.3, -1.0])] * 2
    assert [r["planning"] for r in got] == pytest.approx([0.7, 0.7])
    assert np.allclose(reward_source("execution", "majority_vote")(fb), [1.0, 1.0, 0.0])
    assert np.allclose(reward_source("execution", "majority_vote")(_feedback([None, None, None])), [0, 0, 0])
    assert reward_source("planning", "uncertainty_repetition")(fb) == pytest.approx(1.0 * 0.4 - 0.5 * 0.2)
    assert set(REWARD_SOURCES) == {"planning", "execution", "evaluation"}


def test_an_unknown_reward_source_fails_at_start_up():
    with pytest.raises(ValueError, match="unknown execution reward source 'oracle'"):
        build_method(compose(["method.execution_reward=oracle"]))
