"""Socratic-Zero (SPEC §11): a fixed Teacher, an external model behind an OpenAI-compatible endpoint
(``method.teacher_endpoint``, ``method.teacher_model``), grades the Solver's solutions; the Solver (the
Execution role, no tools) learns from the grades (``teacher`` execution reward: 1 when the Teacher judges
the final answer correct, else 0; a sample without an answer gets 0 without asking).

Without an endpoint the method stops at start-up (``requires`` below) with a message naming the setting;
nothing else is affected. The API key, if the endpoint needs one, is read from the environment variable
named by ``method.extra.api_key_env`` (default ``OPENAI_API_KEY``), never from the config.
"""
from __future__ import annotations

import json
import os
import re
import urllib.request
from typing import Any, Optional

import numpy as np

from unifiedplayers.methods import TaskFeedback, register_reward_source, requires

GRADE_PROMPT = (
    "You are a strict math teacher. Problem:\n{question}\n\nA student's final answer: {answer}\n\n"
    "Is the student's final answer correct? Reply with exactly one word: CORRECT or INCORRECT."
)


def parse_grade(text: str) -> float:
    """1.0 for a reply saying CORRECT, 0.0 for INCORRECT; anything else is an error (never a silent 0)."""
    words = re.findall(r"[A-Za-z]+", text.upper())
    if "INCORRECT" in words:
        return 0.0
    if "CORRECT" in words:
        return 1.0
    raise ValueError(f"teacher reply is neither CORRECT nor INCORRECT: {text[:200]!r}")


class TeacherClient:
    """Minimal OpenAI-compatible chat client (``POST {endpoint}/chat/completions``), greedy, short replies."""

    def __init__(self, endpoint: str, model: str, api_key: Optional[str] = None, timeout_s: float = 60.0) -> None:
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s

    def chat(self, prompt: str, max_tokens: int = 8) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0.0, "max_tokens": max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            data = json.loads(resp.read())
        return data["choices"][0]["message"]["content"]

    def grade(self, question: str, answer: Optional[str]) -> float:
        if answer is None or not str(answer).strip():
            return 0.0
        return parse_grade(self.chat(GRADE_PROMPT.format(question=question, answer=answer)))


_CLIENTS: dict[tuple, TeacherClient] = {}


def teacher_for(method_cfg: Any) -> TeacherClient:
    extra = dict(method_cfg.extra or {})
    key = (method_cfg.teacher_endpoint, method_cfg.teacher_model)
    if key not in _CLIENTS:
        _CLIENTS[key] = TeacherClient(method_cfg.teacher_endpoint, method_cfg.teacher_model,
                                      os.environ.get(extra.get("api_key_env", "OPENAI_API_KEY")),
                                      float(extra.get("teacher_timeout_s", 60.0)))
    return _CLIENTS[key]


def check_teacher(method_cfg: Any) -> None:
    if not method_cfg.teacher_endpoint or not method_cfg.teacher_model:
        raise ValueError(
            f"method={method_cfg.name}: the Teacher is an external model behind an OpenAI-compatible endpoint; "
            "set method.teacher_endpoint=http://HOST:PORT/v1 and method.teacher_model=NAME "
            "(none is configured, so this method cannot run)"
        )


requires("teacher", check_teacher)


@register_reward_source("execution", "teacher")
def execution_teacher(fb: TaskFeedback) -> np.ndarray:
    """The Teacher's grade of each of the K final answers (1 correct, 0 incorrect or missing). Shape (K,)."""
    check_teacher(fb.method_cfg)
    client = teacher_for(fb.method_cfg)
    return np.array([client.grade(fb.question, a) for a in fb.answers], dtype=np.float64)
