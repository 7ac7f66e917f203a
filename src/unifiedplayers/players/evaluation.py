"""The Evaluation player (Critic-Coder, π_C; §3.2, Appendix E.3): M verifiers ``check(trajectory)`` per task.

The prompt holds the task and :data:`unifiedplayers.feedback.trajectory.TRAJECTORY_SCHEMA`, never the expected
answer. A verifier's source is the ``response_prefix`` (by default ````python\\ndef check(trajectory):``, a format
nudge for small backbones) + the generated text; :func:`unifiedplayers.feedback.verifier.compile_verifier` decides
its validity.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from unifiedplayers.players.prompts import render_prompt
from unifiedplayers.feedback.trajectory import TRAJECTORY_SCHEMA


@dataclass
class VerifierSample:
    """One Evaluation output: ``source`` = response prefix + generated text; ``completion`` for GRPO."""

    source: str
    completion: Any = None


def evaluation_prompt(tokenizer: Any, player_cfg: Any, question: str) -> str:
    return render_prompt(tokenizer, player_cfg.evaluation, question=question, schema=TRAJECTORY_SCHEMA)


def write_verifiers(engine: Any, tokenizer: Any, player_cfg: Any, questions: Sequence[str], m: int,
                    seed: Optional[int] = None) -> list[list[VerifierSample]]:
    """``out[t][i]``: verifier ``i`` of the ``m`` sampled for ``questions[t]``."""
    if not questions:
        return []
    prompts = [evaluation_prompt(tokenizer, player_cfg, q) for q in questions]
    outs = engine.generate(prompts, n=m, max_new_tokens=player_cfg.evaluation_max_new_tokens,
                           stop=list(player_cfg.evaluation.stop) or None, seed=seed)
    prefix = player_cfg.evaluation.response_prefix
    return [[VerifierSample(prefix + c.text, c) for c in row] for row in outs]
