"""What one GRPO update trains on (§3.3, Appendix B.3): :class:`TrainSample`, one candidate of a group, and its
constructors from a rollout (:func:`sample_from_segments`, :func:`sample_from_completion`) or from any object with
its field names (:func:`as_sample`).

Pure data, no model: the update (:class:`~unifiedplayers.trainer.base.BaseTrainer`) and the micro-batches
(:mod:`unifiedplayers.trainer.batching`) read it, the phase (:mod:`unifiedplayers.loop.phase`) builds and saves it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

Tensor = torch.Tensor


@dataclass
class TrainSample:
    """One candidate of a group, as the rollout flattens it.

    ``old_logprobs[t]`` is the behaviour log-prob of ``token_ids[t]`` (any value where ``loss_mask[t] == 0``);
    ``loss_mask[t] = 1`` marks a trainable completion token (prompt, padding and tool-observation tokens
    are 0).
    """

    token_ids: Sequence[int] | Tensor
    loss_mask: Sequence[int] | Tensor
    old_logprobs: Sequence[float] | Tensor
    advantage: float
    group: int
    clip_high: Optional[float] = None  # per-sample upper clip ε_high (Agent0's ADPO); None: trainer.clip_eps
    # The log-probs recorded at sampling when ``old_logprobs`` were recomputed by the trainer
    # (``trainer.recompute_old_logprobs``); None: ``old_logprobs`` are the behaviour log-probs.
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
