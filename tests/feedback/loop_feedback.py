"""The feedback function as the outer loop runs it, with the record the loop writes from it (for tests)."""
from __future__ import annotations

from types import SimpleNamespace

from unifiedplayers.feedback.pipeline import FeedbackContext, phase_feedback
from unifiedplayers.loop.phase import feedback_record


def task_feedback(question, trajectories, verifier_sources, perturber, sandbox, reward_cfg, history=(),
                  expected_answer=None, **kwargs):
    """:func:`unifiedplayers.feedback.pipeline.phase_feedback` for one task (``kwargs``: the other fields of
    ``FeedbackContext``)."""
    task = SimpleNamespace(question=question, trajectories=list(trajectories), verifier_sources=list(verifier_sources),
                           expected_answer=expected_answer, tool_calls=[], answer_check=None)
    return phase_feedback([task], FeedbackContext(perturber, sandbox, reward_cfg, history, **kwargs))[0]


def feedback_and_record(question, trajectories, sources, engine, sandbox, reward_cfg, history=(), **fields):
    """(record, rewards) of one task: :func:`task_feedback`, then ξ(q)."""
    fb = task_feedback(question, trajectories, sources, engine, sandbox, reward_cfg, history)
    r = fb.terms
    record = feedback_record(fb, trajectories, sources, engine.rules,
                             {"execution": r.execution, "evaluation": r.evaluation, "planning": r.planning}, {},
                             **fields)
    return record, r
