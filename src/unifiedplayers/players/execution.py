"""The Execution player (Solver, π_S; §3.2, Appendix E.2): K tool-integrated trajectories per task.

The prompt is the task alone, never its expected answer (a method without tools sets a plain-text prompt, checked
by :func:`code_requests`); the multi-turn loop is :func:`unifiedplayers.players.tool_loop.run_tool_loop`.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from unifiedplayers.players.prompts import chat_messages, render_prompt
from unifiedplayers.players.tool_loop import ToolLoopConfig, ToolRollout, run_tool_loop


# What a prompt of a method without tools must not contain (Appendix G.1: Vanilla runs without tool use): a
# sample that obeys a request for code gets one generation and no tool run, so it ends unanswered.
_CODE_REQUEST = re.compile(r"python|```", re.IGNORECASE)


def code_requests(player_cfg: Any, question: str = "") -> list[str]:
    """The phrases of the Execution prompt (system, few-shot, template) that ask for code; [] for plain text."""
    text = "\n".join(m["content"] for m in chat_messages(player_cfg.execution, question=question))
    return sorted({m.group(0).lower() for m in _CODE_REQUEST.finditer(text)})


def execution_prompt(tokenizer: Any, player_cfg: Any, question: str) -> str:
    if player_cfg.execution.response_prefix:
        raise ValueError("player.execution.response_prefix is not supported: the tool loop parses only generated text")
    return render_prompt(tokenizer, player_cfg.execution, question=question)


def solve(engine: Any, sandbox: Any, tokenizer: Any, player_cfg: Any, questions: Sequence[str], k: int,
          seed: Optional[int] = None, temperature: float = 1.0, top_p: float = 1.0) -> list[list[ToolRollout]]:
    """``out[t][j]``: trajectory ``j`` of the ``k`` sampled for ``questions[t]`` (all in one batched loop)."""
    if not questions:
        return []
    prompts = [execution_prompt(tokenizer, player_cfg, q) for q in questions]
    loop_cfg = ToolLoopConfig.from_player_config(player_cfg, temperature=temperature, top_p=top_p)
    return run_tool_loop(engine, sandbox, prompts, list(questions), loop_cfg, n=k, seed=seed)
