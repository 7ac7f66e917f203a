"""The three players (§3.1, §3.2, Appendix E): prompts, parsing of their outputs, and the Execution tool loop.

- :mod:`~unifiedplayers.players.planning`: questioner prompt with rotating topics -> :class:`PlanningTask`
  (question + expected answer, or a malformed output with its reason).
- :mod:`~unifiedplayers.players.execution`: K tool-integrated trajectories per task (``run_tool_loop``).
- :mod:`~unifiedplayers.players.evaluation`: M verifier candidates ``check(trajectory)`` per task.
- :mod:`~unifiedplayers.players.prompts`: chat rendering of the prompts in ``conf/player/``.

Prompts live in ``conf/player/`` and can be edited without touching code.
"""
from unifiedplayers.players.evaluation import VerifierSample, evaluation_prompt, write_verifiers
from unifiedplayers.players.execution import execution_prompt, solve
from unifiedplayers.players.planning import PlanningTask, generate_tasks, parse_task, planning_prompt, topic_at
from unifiedplayers.players.prompts import chat_messages, fill, render_prompt

from unifiedplayers.roles import ROLES  # noqa: E402 (defined once)
