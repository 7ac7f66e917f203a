"""The feedback function as the outer loop runs it, with the record the loop writes from it (for tests)."""
from __future__ import annotations

from unifiedplayers.feedback.pipeline import task_feedback
from unifiedplayers.loop.phase import feedback_record


def feedback_and_record(question, trajectories, sources, engine, sandbox, reward_cfg, history=(), **fields):
    """(record, rewards) of one task: :func:`unifiedplayers.feedback.pipeline.task_feedback`, then ξ(q)."""
    fb = task_feedback(question, trajectories, sources, engine, sandbox, reward_cfg, history)
    r = fb.terms
    record = feedback_record(fb, trajectories, sources, engine.rules,
                             {"execution": r.execution, "evaluation": r.evaluation, "planning": r.planning}, {},
                             **fields)
    return record, r
