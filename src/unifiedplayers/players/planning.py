"""The Planning player (Task-Setter, π_T; §3.2, Appendix E.1): a fixed questioner prompt with rotating topics.

Each output should be a multi-step math problem followed by its answer in ``\\boxed{}``. :func:`parse_task` splits
it into the question and the expected answer (used only to discard malformed outputs, never shown to the other
players); a malformed output is a :class:`PlanningTask` with ``valid=False``, a ``reason`` and the reward
``cfg.reward.malformed_task_reward``.

Generation stops at ``"}\\n"`` (``player.planning.stop``), the end of ``Answer: \\boxed{N}``. A line of the task
can end in a LaTeX ``}`` too, so a stop that leaves no closed ``\\boxed{}`` is not the end: the sample is continued
from its own tokens (:func:`continue_unanswered`) and the pieces joined, so no task is cut before its answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from unifiedplayers.players.prompts import render_prompt
from unifiedplayers.rollout.types import Completion, Segment
from unifiedplayers.feedback.trajectory import _boxed_spans

MAX_CONTINUATIONS = 4  # continuations of one Planning sample after a stop string that was not its end

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
    place: Optional[tuple[int, int]] = None  # (group, position) among its phase's outputs (sampling.place_outputs)


def parse_task(text: str, min_chars: int = 20, max_chars: int = 1200, answer_max_chars: int = 64) -> PlanningTask:
    """Split a Planning output into question and expected answer, marking malformed outputs: the answer is the
    content of the last balanced ``\\boxed{}``, the question the text before it without "Answer:"/"Problem:" labels."""
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


def _stopped_before_answer(prefix: str, c: Completion) -> bool:
    """A stop string ended ``c`` while its text holds no closed ``\\boxed{}`` yet (a LaTeX ``}`` of the
    task itself, not the answer line)."""
    return c.finish_reason == "stop" and c.stop_str is not None and not _boxed_spans(prefix + c.text)


def _joined(tokenizer: Any, first: Completion, more: Completion) -> Completion:
    """One completion from ``first`` and its continuation ``more`` (prompt of ``first``, tokens and
    behaviour log-probs of both in order)."""
    # Characters of first's last token past its stop string are in the context ``more`` continued.
    decoded = tokenizer.decode(first.token_ids, skip_special_tokens=True)
    overhang = decoded[len(first.text):] if decoded.startswith(first.text) else ""
    return Completion(prompt_ids=list(first.prompt_ids), token_ids=list(first.token_ids) + list(more.token_ids),
                      text=first.text + overhang + more.text, logprobs=list(first.logprobs) + list(more.logprobs),
                      finish_reason=more.finish_reason, stop_str=more.stop_str)


def continue_unanswered(engine: Any, tokenizer: Any, outs: list[list[Completion]], prefix: str, max_new_tokens: int,
                        stop: Optional[Sequence[str]], seed: Optional[int] = None) -> list[list[Completion]]:
    """Continue every sample whose stop string fired before its ``\\boxed{}`` answer, at most ``MAX_CONTINUATIONS``
    times within ``max_new_tokens`` in all, one engine call per round; returns ``outs`` with those samples joined."""
    outs = [list(row) for row in outs]
    for round_ in range(MAX_CONTINUATIONS):
        todo = [(p, g) for p, row in enumerate(outs) for g, c in enumerate(row)
                if _stopped_before_answer(prefix, c) and len(c.token_ids) < max_new_tokens]
        if not todo:
            break
        by_budget: dict[int, list[tuple[int, int]]] = {}
        for p, g in todo:  # one call per remaining token budget (usually one)
            by_budget.setdefault(max_new_tokens - len(outs[p][g].token_ids), []).append((p, g))
        for budget, items in by_budget.items():
            contexts = [[Segment.inserted(outs[p][g].prompt_ids), outs[p][g].as_segment()] for p, g in items]
            more = engine.continue_segments(contexts, n=1, max_new_tokens=budget, stop=list(stop or []) or None,
                                            seed=None if seed is None else seed + 1 + round_)
            for (p, g), row in zip(items, more):
                outs[p][g] = _joined(tokenizer, outs[p][g], row[0])
    return outs


def generate_tasks(engine: Any, tokenizer: Any, player_cfg: Any, first_prompt: int, num_prompts: int,
                   tasks_per_prompt: int, seed: Optional[int] = None,
                   prompts: Optional[Sequence[tuple[str, str]]] = None) -> list[list[PlanningTask]]:
    """``out[p][g]``: task ``g`` of questioner prompt ``p`` (topic ``topic_at(first_prompt + p)``). ``prompts``:
    ``num_prompts`` (topic, rendered prompt) pairs of a method's own, used without a response prefix."""
    if prompts is None:
        topics = [topic_at(player_cfg.topics, first_prompt + p) for p in range(num_prompts)]
        prompts = [planning_prompt(tokenizer, player_cfg, t) for t in topics]
    else:
        if len(prompts) != num_prompts:
            raise ValueError(f"{len(prompts)} prompts given for num_prompts={num_prompts}")
        topics, prompts = [t for t, _ in prompts], [text for _, text in prompts]
        player_cfg = OmegaConf.merge(player_cfg, {"planning": {"response_prefix": ""}})
    stop = list(player_cfg.planning.stop) or None
    outs = engine.generate(prompts, n=tasks_per_prompt, max_new_tokens=player_cfg.planning_max_new_tokens, stop=stop,
                           seed=seed)
    outs = continue_unanswered(engine, tokenizer, outs, player_cfg.planning.response_prefix,
                               player_cfg.planning_max_new_tokens, stop, seed)
    result = []
    for p, (topic, row) in enumerate(zip(topics, outs)):
        result.append([])
        for c in row:
            t = parse_task(player_cfg.planning.response_prefix + c.text, player_cfg.task_min_chars,
                           player_cfg.task_max_chars, player_cfg.answer_max_chars)
            t.prompt_index, t.topic, t.completion = p, topic, c
            result[-1].append(t)
    return result
