"""The data of the rollout contract: :class:`Completion`, :class:`Segment`, and the pure helpers around them.

Nothing here touches a model; it is shared by every backend and by the code that trains on rollouts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

FINISH_REASONS = ("stop", "length")


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    - ``prompt_ids``: the context it continues (the prompt's tokens, or the flattened segments).
    - ``token_ids``: the generated tokens, eos included when the model emitted it; when a stop string
      ended it, the shortest prefix whose decoding contains the stop string.
    - ``text``: the decoded completion (special tokens skipped), cut right after the stop string.
      When the last token carries characters past the stop string, those are in ``token_ids`` but not
      in ``text``.
    - ``logprobs``: one behaviour log-probability per token of ``token_ids``, of the distribution the
      token was sampled from (see the package docstring), from the sampling forward pass itself.
    - ``finish_reason``: ``"stop"`` (eos or a stop string) or ``"length"`` (``max_new_tokens`` or the
      model's context limit).
    - ``stop_str``: the stop string that ended it, else ``None``.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str
    stop_str: Optional[str] = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Completion: {len(self.token_ids)} token_ids but {len(self.logprobs)} logprobs")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Completion: finish_reason={self.finish_reason!r} is not one of {FINISH_REASONS}")

    def as_segment(self) -> "Segment":
        """The completion as a trainable segment carrying its behaviour log-probs."""
        return Segment(list(self.token_ids), trainable=True, logprobs=list(self.logprobs))


@dataclass
class Segment:
    """A run of tokens in a multi-turn context.

    Generated segments (``trainable=True``) carry the behaviour ``logprobs`` recorded when they were
    sampled. Inserted segments (the prompt, tool observations) are never trainable and carry none.
    """

    token_ids: list[int]
    trainable: bool = False
    logprobs: Optional[list[float]] = field(default=None)

    def __post_init__(self) -> None:
        self.token_ids = [int(t) for t in self.token_ids]
        if self.trainable:
            if self.logprobs is None or len(self.logprobs) != len(self.token_ids):
                raise ValueError(
                    "Segment: a trainable segment needs one behaviour logprob per token "
                    f"({len(self.token_ids)} tokens, logprobs={None if self.logprobs is None else len(self.logprobs)})"
                )
        elif self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"Segment: {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")

    @classmethod
    def inserted(cls, token_ids: Sequence[int]) -> "Segment":
        """A segment the environment inserted (prompt, tool observation): in the context, not in the loss."""
        return cls(list(token_ids), trainable=False, logprobs=None)

    @classmethod
    def from_text(cls, tokenizer: Any, text: str) -> "Segment":
        """An inserted segment from text, tokenized without special tokens."""
        return cls.inserted(tokenizer(text, add_special_tokens=False)["input_ids"])


def flatten_segments(segments: Sequence[Segment]) -> tuple[list[int], list[int], list[float]]:
    """``segments -> (token_ids, loss_mask, old_logprobs)``, the three aligned to ``token_ids``.

    ``loss_mask`` is 1 on trainable (generated) tokens and 0 on inserted ones; ``old_logprobs`` holds
    the behaviour log-probs on trainable tokens and 0.0 elsewhere (masked out of the loss).
    """
    token_ids: list[int] = []
    mask: list[int] = []
    old: list[float] = []
    for seg in segments:
        if not isinstance(seg, Segment):
            raise TypeError(f"flatten_segments: expected Segment, got {type(seg).__name__}")
        token_ids.extend(seg.token_ids)
        if seg.trainable:
            mask.extend([1] * len(seg.token_ids))
            old.extend(float(x) for x in seg.logprobs)  # type: ignore[union-attr]
        else:
            mask.extend([0] * len(seg.token_ids))
            old.extend([0.0] * len(seg.token_ids))
    return token_ids, mask, old


def find_stop(text: str, stop: Sequence[str], search_from: int = 0) -> Optional[tuple[int, str]]:
    """The earliest-ending occurrence of any stop string in ``text[search_from:]``.

    Returns ``(end, stop_str)`` with ``text[:end]`` ending in ``stop_str``, or ``None``. Among stop
    strings ending at the same place the longest wins.
    """
    best: Optional[tuple[int, str]] = None
    for s in stop:
        i = text.find(s, search_from)
        if i < 0:
            continue
        end = i + len(s)
        if best is None or end < best[0] or (end == best[0] and len(s) > len(best[1])):
            best = (end, s)
    return best


def validate_sampling(
    n: int, max_new_tokens: int, temperature: float, top_p: float, stop: Optional[Sequence[str]]
) -> list[str]:
    """Check the sampling arguments shared by all backends; return ``stop`` as a list."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: need at least one completion per prompt")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: need a positive integer")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature!r}: need a finite value > 0 (use greedy=True for argmax)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r}: need 0 < top_p <= 1")
    if stop is None:
        return []
    if isinstance(stop, str):
        raise TypeError("stop must be a list of strings, not a single string")
    stops = list(stop)
    for s in stops:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
    return stops


def encode_prompts(prompts: Sequence[Any], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Prompts as token ids: strings (already chat-rendered) are tokenized without adding special
    tokens; lists of ints are checked against the vocabulary."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError("prompts must be a list of strings or a list of token-id lists")
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        elif isinstance(p, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"prompt {i}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
        else:
            raise TypeError(f"prompt {i}: expected a string or a list of ints, got {type(p).__name__}")
        if not ids:
            raise ValueError(f"prompt {i} is empty: generation needs at least one context token")
        out.append(list(ids))
    return out


def segments_to_prompts(contexts: Sequence[Sequence[Segment]]) -> list[list[int]]:
    """The token ids of each multi-turn context (for ``continue_segments``)."""
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise TypeError("continue_segments expects a list of segment lists")
    prompts = []
    for i, ctx in enumerate(contexts):
        if isinstance(ctx, Segment) or not isinstance(ctx, Sequence):
            raise TypeError(f"context {i}: expected a list of Segment, got {type(ctx).__name__}")
        prompts.append(flatten_segments(ctx)[0])
    return prompts
