"""The three players (§3.1, §3.2, Appendix E): :mod:`.planning` (tasks), :mod:`.execution` (tool-integrated
trajectories, :mod:`.tool_loop`) and :mod:`.evaluation` (verifiers); their prompts live in ``conf/player/``
(:mod:`.prompts`) and can be edited without touching code."""
from unifiedplayers.players.evaluation import VerifierSample, evaluation_prompt, write_verifiers
from unifiedplayers.players.execution import execution_prompt, solve
from unifiedplayers.players.planning import PlanningTask, generate_tasks, parse_task, planning_prompt, topic_at
from unifiedplayers.players.prompts import chat_messages, fill, render_prompt
