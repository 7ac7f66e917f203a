"""The Planning player (Task-Setter, π_T; SPEC §1): a fixed questioner prompt with rotating topics.

Each output should be a multi-step math problem followed by its answer in ``\\boxed{}``.
:func:`parse_task` splits it into the question (shown to the other players) and the expected answer
(used only to discard malformed outputs; never shown to Execution or Evaluation). A malformed output
(no boxed answer, no question, the answer inside the question, too short or too long) is a
:class:`PlanningTask` with ``valid=False`` and a ``reason``; its reward is
``cfg.reward.malformed_task_reward`` (the schedule applies it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from unifiedplayers.players.prompts import render_prompt
from unifiedplayers.trajectory import _boxed_spans

# Labels a model puts before its answer or its question; stripped from the question text.
_ANSWER_LABEL = re.compile(
    r"(?:^|\n)[ \t]*(?:\*\*)?(?:final\s+answer|answer|the\s+answer\s+is|solution)(?:\*\*)?\s*[:=]?\s*(?:\*\*)?\s*\$*\s*$",
    re.IGNORECASE,
)
_INLINE_ANSWER_LABEL = re.compile(r"[ \t]*(?:final\s+answer|answer|the\s+answer\s+is)\s*[:=]?\s*$", re.IGNORECASE)
_QUESTION_LABEL = re.compile(
    r"^\s*(?:\*\*)?(?:problem|question|task)(?:\s*\d+)?(?:\*\*)?\s*[:.]\s*(?:\*\*)?\s*", re.IGNORECASE
)


@dataclass
class PlanningTask:
    """One Planning output: ``text`` as generated (prefix included), and what was parsed from it."""

    text: str
    question: Optional[str]
    expected_answer: Optional[str]
    valid: bool
    reason: str = ""  # why it is malformed ("" when valid)
    prompt_index: int = 0  # which questioner prompt of the update produced it (its GRPO group)
    topic: str = ""
    completion: Any = None  # the rollout Completion (token ids, behaviour log-probs)
    check: Any = None  # answer -> bool, for tasks whose answers are verified by execution (methods.TASK_BUILDERS)


def parse_task(text: str, min_chars: int = 20, max_chars: int = 1200, answer_max_chars: int = 64) -> PlanningTask:
    """Split a Planning output into question and expected answer; mark malformed outputs.

    The answer is the content of the last balanced ``\\boxed{}``; the question is the text before that
    box, without a trailing "Answer:" label and a leading "Problem:" label.
    """
    spans = _boxed_spans(text)
    if not spans:
        return PlanningTask(text, None, None, False, "no \\boxed{} answer")
    start, _end, answer = spans[-1]
    answer = answer.strip()
    if not answer:
        return PlanningTask(text, None, None, False, "empty \\boxed{} answer")
    if len(answer) > answer_max_chars:
        return PlanningTask(text, None, answer, False, f"answer longer than {answer_max_chars} characters")
    question = text[:start]
    question = _ANSWER_LABEL.sub("", question.rstrip())
    question = _INLINE_ANSWER_LABEL.sub("", question)
    question = _QUESTION_LABEL.sub("", question).strip()
    if _boxed_spans(question) or "\\boxed" in question:
        return PlanningTask(text, question, answer, False, "a \\boxed{} answer inside the question")
    if len(question) < min_chars:
        return PlanningTask(text, question or None, answer, False, f"question shorter than {min_chars} characters")
    if len(question) > max_chars:
        return PlanningTask(text, question, answer, False, f"question longer than {max_chars} characters")
    return PlanningTask(text, question, answer, True)


def topic_at(topics: Sequence[str], index: int) -> str:
    """The rotating topic category of questioner prompt number ``index`` (0-based, across the run)."""
    return topics[index % len(topics)] if topics else "any topic"


def planning_prompt(tokenizer: Any, player_cfg: Any, topic: str) -> str:
    return render_prompt(tokenizer, player_cfg.planning, topic=topic)


def generate_tasks(
    engine: Any,
    tokenizer: Any,
    player_cfg: Any,
    first_prompt: int,
    num_prompts: int,
    tasks_per_prompt: int,
    seed: Optional[int] = None,
) -> list[list[PlanningTask]]:
    """``out[p][g]``: task ``g`` of questioner prompt ``p`` (topic ``topic_at(first_prompt + p)``)."""
    topics = [topic_at(player_cfg.topics, first_prompt + p) for p in range(num_prompts)]
    prompts = [planning_prompt(tokenizer, player_cfg, t) for t in topics]
    outs = engine.generate(
        prompts,
        n=tasks_per_prompt,
        max_new_tokens=player_cfg.planning_max_new_tokens,
        stop=list(player_cfg.planning.stop) or None,
        seed=seed,
    )
    result = []
    for p, (topic, row) in enumerate(zip(topics, outs)):
        tasks = []
        for c in row:
            t = parse_task(
                player_cfg.planning.response_prefix + c.text,
                player_cfg.task_min_chars,
                player_cfg.task_max_chars,
                player_cfg.answer_max_chars,
            )
            t.prompt_index, t.topic, t.completion = p, topic, c
            tasks.append(t)
        result.append(tasks)
    return result
