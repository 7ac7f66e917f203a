"""Prompts of the evaluation protocol, one per answer type, for the ``vanilla`` and ``tool`` modes; the templates
live in ``conf/eval/*.yaml`` (``prompts.*``), so that every method is evaluated with the same text.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from unifiedplayers.data.benchmarks import Benchmark, Problem
from unifiedplayers.players.prompts import fill, option_fields


def user_message(bench: Benchmark, problem: Problem, templates: Any) -> str:
    """The user turn for ``problem``: the template of its answer type, filled in."""
    if bench.answer_type == "program":
        return fill(templates.program, prompt=problem.meta["prompt"])
    if bench.answer_type == "option":
        return fill(templates.option, question=problem.question, **option_fields(problem.options or []))
    template = templates.math if bench.answer_type == "math" else templates.string
    return fill(template, question=problem.question)


def use_chat_template(tokenizer: Any, setting: str) -> bool:
    if setting == "auto":
        return bool(getattr(tokenizer, "chat_template", None))
    if setting in ("true", "True", True):
        return True
    if setting in ("false", "False", False):
        return False
    raise ValueError(f"eval.chat_template={setting!r}: use auto, true or false")


def render_prompt(tokenizer: Any, user: str, system: Optional[str], chat: bool) -> str:
    """The prompt string given to the engine (chat-rendered when ``chat``)."""
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system}\n\n{user}\n" if system else f"{user}\n"


def tool_mode_messages(bench: Benchmark, problem: Problem, templates: Any, execution_prompts: Any) -> Any:
    """The Execution player's prompt config and question for ``problem`` in tool mode: for ``math`` the player's
    whole prompt around the bare question; otherwise its system text, then the benchmark's own user turn (its
    worked example ends in a numeric ``\\boxed{N}``, which these benchmarks do not take)."""
    if bench.answer_type == "math":
        return execution_prompts, problem.question
    own = SimpleNamespace(system=execution_prompts.system, few_shot=[], template="{question}", response_prefix="")
    return own, user_message(bench, problem, templates)


def build_prompt(bench: Benchmark, problem: Problem, mode: str, templates: Any, tokenizer: Any,
                 chat_setting: str = "auto", execution_prompts: Optional[Any] = None) -> str:
    """Prompt of ``problem`` in ``mode``. With ``execution_prompts``, tool mode renders :func:`tool_mode_messages`
    as training renders the player's prompts; without a chat template, a vanilla HumanEval prompt is the function
    stub itself (the original completion protocol)."""
    if mode == "tool" and execution_prompts is not None:
        from unifiedplayers.players.prompts import render_prompt as render_player_prompt

        prompts, question = tool_mode_messages(bench, problem, templates, execution_prompts)
        return render_player_prompt(tokenizer, prompts, include_prefix=False, question=question)
    chat = use_chat_template(tokenizer, chat_setting)
    if bench.answer_type == "program" and not chat and mode == "vanilla":
        return problem.meta["prompt"]
    system = templates.tool_system if mode == "tool" else (templates.system or None)
    return render_prompt(tokenizer, user_message(bench, problem, templates), system, chat)
