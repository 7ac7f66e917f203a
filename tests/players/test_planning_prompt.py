"""The Planning prompt of the paper presets and its stop string."""
from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest

from unifiedplayers.config import compose
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players import generate_tasks, parse_task, planning_prompt, topic_at
from unifiedplayers.players.planning import MAX_CONTINUATIONS
from tests.players.scripted import ScriptedEngine  # noqa: E402

pytestmark = pytest.mark.cpu

PAPER_PRESETS = ["paper_qwen3_4b", "paper_mimo_7b"]


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def _replay(full: str):
    """A model that writes ``full``: each call continues from where the context's text ends."""

    def respond(context: str, j: int) -> str:
        for i in range(len(full), 0, -1):
            if context.endswith(full[:i]):
                return full[i:]
        return full

    return respond


# ---------------------------------------------------------------- the paper presets' prompt


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_paper_presets_ask_for_competition_problems_in_rotating_topics(preset, tok):
    cfg = compose([f"experiment={preset}"])
    p = cfg.player
    # Appendix E.1 / I.1: algebra, number theory, combinatorics, geometry, one per questioner prompt
    assert list(p.topics) == ["algebra", "number theory", "combinatorics", "geometry"]
    assert [topic_at(p.topics, i) for i in range(5)] == ["algebra", "number theory", "combinatorics",
                                                         "geometry", "algebra"]
    text = planning_prompt(tok, p, "number theory")
    assert "competition" in text and "number theory" in text
    assert "integer, a simple fraction, or a short closed-form expression" in text
    assert "word problem" not in text.lower()
    assert list(p.planning.stop) == ["}\n"]


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_paper_few_shot_tasks_parse_and_their_answers_are_right(preset):
    shots = compose([f"experiment={preset}"]).player.planning.few_shot
    tasks = [parse_task(s.assistant) for s in shots]
    assert all(t.valid for t in tasks), [t.reason for t in tasks]
    # By hand:
    # x + 1/x = 3 -> x³ + 1/x³ = (x + 1/x)³ − 3(x + 1/x) = 27 − 9 = 18
    # two dice, prime sums 2, 3, 5, 7, 11 in 1 + 2 + 4 + 6 + 2 = 15 of 36 outcomes -> 15/36 = 5/12
    # circle of radius √2 has area 2π; its inscribed square has diagonal 2√2, side 2, area 4 -> 2π − 4
    assert [t.expected_answer for t in tasks] == ["18", "\\frac{5}{12}", "2\\pi - 4"]
    assert sum(1 for a in range(1, 7) for b in range(1, 7) if a + b in (2, 3, 5, 7, 11)) == 15
    assert Fraction(15, 36) == Fraction(5, 12)


def test_smoke_preset_keeps_the_simple_topics():
    p = compose(["experiment=smoke"]).player
    assert "arithmetic" in list(p.topics) and "algebra" not in list(p.topics)


# ---------------------------------------------------------------- the stop string


def test_a_task_line_ending_in_a_latex_brace_is_not_cut(tok):
    cfg = compose(["experiment=paper_qwen3_4b"]).player
    full = ("Find the sum of the infinite geometric series with first term 1 and common ratio \\frac{1}{2}\n"
            "Answer: \\boxed{2}\nWrite another problem")
    engine = ScriptedEngine(tok, _replay(full))
    [[task]] = generate_tasks(engine, tok, cfg, first_prompt=0, num_prompts=1, tasks_per_prompt=1, seed=0)
    # "}\n" fired first after \frac{1}{2} (no \boxed{} yet): continued, then it ended after the answer line
    assert engine.calls == 2
    assert task.valid, task.reason
    assert task.question.endswith("common ratio \\frac{1}{2}") and task.expected_answer == "2"
    c = task.completion
    assert c.text == full[: full.index("Write another")] and c.stop_str == "}\n"
    # one completion for GRPO: tokens and behaviour log-probs of both pieces, aligned
    assert tok.decode(c.token_ids) == c.text and len(c.logprobs) == len(c.token_ids)


def test_several_latex_line_ends_and_the_budget(tok):
    cfg = compose(["experiment=paper_qwen3_4b"]).player
    full = ("Let a + b = 3 and ab = \\frac{1}{2}\nand c = \\sqrt{2}\nFind a^2 + b^2 + c^2.\n"
            "Answer: \\boxed{10}\n")  # a² + b² = 9 − 2·(1/2) = 8, plus c² = 2
    engine = ScriptedEngine(tok, _replay(full))
    [[task]] = generate_tasks(engine, tok, cfg, 0, 1, 1, seed=0)
    assert engine.calls == 3 and task.valid and task.expected_answer == "10" and task.completion.text == full
    # The continuations share planning_max_new_tokens: with 40 byte tokens the answer is never reached
    short = compose(["experiment=paper_qwen3_4b", "player.planning_max_new_tokens=40"]).player
    engine = ScriptedEngine(tok, _replay(full))
    [[cut]] = generate_tasks(engine, tok, short, 0, 1, 1, seed=0)
    assert len(cut.completion.token_ids) <= 40 and not cut.valid and cut.reason == "no \\boxed{} answer"
    assert engine.calls <= 1 + MAX_CONTINUATIONS


def test_an_answer_line_still_stops_at_once(tok):
    cfg = compose(["experiment=paper_qwen3_4b"]).player
    full = "What is the remainder when 3^{100} is divided by 7?\nAnswer: \\boxed{4}\nmore text"
    engine = ScriptedEngine(tok, _replay(full))
    [[task]] = generate_tasks(engine, tok, cfg, 0, 1, 1, seed=0)
    # 3^6 ≡ 1 (mod 7), 100 = 6·16 + 4, 3^4 = 81 = 77 + 4 -> 4; "{100}" is not at a line end: one call
    assert engine.calls == 1 and task.expected_answer == "4" and pow(3, 100, 7) == 4
