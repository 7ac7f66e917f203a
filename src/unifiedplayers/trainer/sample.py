"""What one GRPO update trains on (§3.3, Appendix B.3): :class:`TrainSample`, one candidate of a group, pure data,
and its constructors from a rollout or from any object with its field names (:func:`as_sample`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

Tensor = torch.Tensor


@dataclass
class TrainSample:
    """One candidate of a group, as the rollout flattens it: ``loss_mask[t] = 1`` marks a trainable completion token
    (0: prompt, padding, tool observation); ``old_logprobs[t]``, the behaviour log-prob of ``token_ids[t]``."""

    token_ids: Sequence[int] | Tensor
    loss_mask: Sequence[int] | Tensor
    old_logprobs: Sequence[float] | Tensor
    advantage: float
    group: int
    clip_high: Optional[float] = None  # per-sample upper clip ε_high (Agent0's ADPO); None: trainer.clip_eps
    # Recorded at sampling when the trainer recomputed ``old_logprobs`` (``trainer.recompute_old_logprobs``)
    behaviour_logprobs: Optional[Sequence[float] | Tensor] = None


def sample_from_segments(segments: Sequence[Any], advantage: float, group: int) -> TrainSample:
    """A :class:`TrainSample` from a rollout's segment list (prompt, generated turns, tool observations)."""
    from unifiedplayers.rollout.types import flatten_segments

    token_ids, loss_mask, old_logprobs = flatten_segments(segments)
    return TrainSample(token_ids, loss_mask, old_logprobs, advantage, group)


def sample_from_completion(completion: Any, advantage: float, group: int) -> TrainSample:
    """A :class:`TrainSample` from a single-turn rollout ``Completion`` (prompt tokens are not trained)."""
    prompt, generated = list(completion.prompt_ids), list(completion.token_ids)
    return TrainSample(
        prompt + generated,
        [0] * len(prompt) + [1] * len(generated),
        [0.0] * len(prompt) + [float(x) for x in completion.logprobs],
        advantage,
        group,
    )


def as_sample(item: Any) -> TrainSample:
    """Accept a :class:`TrainSample`, a mapping or any object with the same field names."""
    if isinstance(item, TrainSample):
        return item
    get = item.__getitem__ if isinstance(item, Mapping) else lambda k: getattr(item, k)
    return TrainSample(get("token_ids"), get("loss_mask"), get("old_logprobs"), get("advantage"), get("group"))
