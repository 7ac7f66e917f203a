"""The observation text of one executed code block, as the Execution player sees it (§2, Appendix D.3).

One formatter for the tool loop (``players/tool_loop.py``) and arg_mutation's re-execution, truncation included:
an output that came back whole in a variant only would give it away.
"""
from __future__ import annotations

from typing import Any

from unifiedplayers.feedback.trajectory import format_observation

DEFAULT_OBSERVATION_MAX_CHARS = 1024  # conf/player/default.yaml observation_max_chars


def truncate_observation(text: str, max_chars: int) -> str:
    """Keep the head (2/3) and tail (1/3) of an over-long observation, with a marker saying how much
    was cut; ``max_chars <= 0`` keeps everything."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[len(text) - tail:]}"


def observation_body(result: Any, max_chars: int) -> str:
    """The observation of one sandbox ``ExecResult``: :func:`~unifiedplayers.feedback.trajectory.format_observation`,
    then :func:`truncate_observation` to ``max_chars`` (``player.observation_max_chars``)."""
    body = format_observation(result.stdout, result.stderr, result.exit_code,
                              timed_out=bool(getattr(result, "timed_out", False)),
                              memory_exceeded=bool(getattr(result, "memory_exceeded", False)))
    return truncate_observation(body, max_chars)
