"""Rendering a player's prompt from ``conf/player/`` with the tokenizer's chat template.

A prompt (:class:`unifiedplayers.config.PlayerPrompts`) is: an optional ``system`` message, the
``few_shot`` pairs as user/assistant turns, and ``template`` as the final user turn. Placeholders are
``{name}`` and only the names passed in are replaced, so literal braces (``\\boxed{}``) need no escaping.
``response_prefix`` is appended after the generation prompt: the reply starts with it.
"""
from __future__ import annotations

from typing import Any, Sequence

from unifiedplayers.feedback.answers import option_letters


def fill(template: str, **values: str) -> str:
    """Replace ``{name}`` for each given name; everything else (``\\boxed{}``, code braces) is kept."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", str(value))
    return template


def option_fields(options: Sequence[str]) -> dict[str, str]:
    """The ``{options}`` ("A. text" lines) and ``{letters}`` ("A, B, ...") of a multiple-choice template."""
    letters = option_letters(len(options))
    return {"options": "\n".join(f"{letter}. {text}" for letter, text in zip(letters, options)),
            "letters": ", ".join(letters)}


def chat_messages(prompts: Any, **values: str) -> list[dict[str, str]]:
    """The chat messages of a prompt config with the placeholders filled in."""
    messages: list[dict[str, str]] = []
    if prompts.system:
        messages.append({"role": "system", "content": fill(prompts.system, **values)})
    for i, shot in enumerate(prompts.few_shot):
        if "user" not in shot or "assistant" not in shot:
            raise ValueError(f"few_shot[{i}] needs both 'user' and 'assistant' keys, got {sorted(shot)}")
        messages.append({"role": "user", "content": fill(shot["user"], **values)})
        messages.append({"role": "assistant", "content": fill(shot["assistant"], **values)})
    messages.append({"role": "user", "content": fill(prompts.template, **values)})
    return messages


def render_prompt(tokenizer: Any, prompts: Any, include_prefix: bool = True, **values: str) -> str:
    """The prompt string given to the rollout engine (chat template, generation prompt, response prefix); a
    tokenizer without a chat template gets a plain ``system / user / assistant`` transcript."""
    messages = chat_messages(prompts, **values)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return text + (prompts.response_prefix if include_prefix else "")
