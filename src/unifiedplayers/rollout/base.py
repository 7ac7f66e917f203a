"""The backend-independent half of a rollout engine: argument defaults, validation, segments."""
from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence

from unifiedplayers.config import RolloutConfig
from unifiedplayers.registry import Registry
from unifiedplayers.rollout.types import Completion, Segment, encode_prompts, segments_to_prompts, validate_sampling


class RolloutEngine:
    """Samples completions with behaviour log-probs. Backends implement :meth:`_generate_ids` and
    :meth:`update_weights`; everything a caller sees is defined here.

    A backend is registered by name (:func:`register_rollout_engine`, ``rollout.backend``) or named by its
    ``conf/rollout/<name>.yaml`` (``_target_: my_module.MyEngine``), and says how the loop should hold it
    (:attr:`samples_from_module`) and what it needs before any model loads (:meth:`check`,
    :meth:`check_ranks`)."""

    backend: str = ""
    # True: the engine samples from the very module it is given (hf), so the loop keeps one engine per model
    # object and the trainer's updates are seen without a copy. False: the engine holds its own copy of the
    # weights (vllm), so the loop keeps one engine and swaps a player's weights in with update_weights.
    samples_from_module: ClassVar[bool] = False

    @classmethod
    def check(cls, cfg: RolloutConfig) -> None:
        """Refuse, before any model is loaded, a setting or an environment this backend cannot run (vllm: not
        installed, or a version outside its tested window). Nothing to check by default."""

    @classmethod
    def check_ranks(cls, cfg: RolloutConfig, world_size: int) -> None:
        """Refuse settings this backend cannot run over ``world_size`` > 1 data-parallel ranks (``torchrun``)."""

    def __init__(self, cfg: RolloutConfig, model: Any, tokenizer: Any) -> None:
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer

    # ----------------------------------------------------------------- public interface

    def generate(
        self,
        prompts: Sequence[Any],
        n: int = 1,
        max_new_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        stop: Optional[Sequence[str]] = None,
        greedy: bool = False,
        seed: Optional[int] = None,
        ignore_eos: bool = False,
    ) -> list[list[Completion]]:
        """``n`` completions for each prompt: ``outs[i][j]`` is the ``j``-th sample of ``prompts[i]``.

        ``prompts`` are chat-rendered strings (tokenized without adding special tokens) or token-id
        lists. ``max_new_tokens``, ``temperature`` and ``top_p`` default to the rollout config.
        ``greedy=True`` takes the argmax (temperature and top_p are then ignored). ``seed`` makes a call
        reproducible; ``None`` draws from the global RNG. ``ignore_eos`` keeps sampling past eos (for
        fixed-length benchmarks).
        """
        prompt_ids = encode_prompts(prompts, self.tokenizer, self._vocab_size())
        return self._generate_checked(prompt_ids, n, max_new_tokens, temperature, top_p, stop, greedy, seed, ignore_eos)

    def continue_segments(
        self,
        contexts: Sequence[Sequence[Segment]],
        n: int = 1,
        max_new_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        stop: Optional[Sequence[str]] = None,
        greedy: bool = False,
        seed: Optional[int] = None,
        ignore_eos: bool = False,
    ) -> list[list[Completion]]:
        """Continue each multi-turn context (a list of :class:`Segment`) with ``n`` completions.

        Each returned completion's ``prompt_ids`` is the flattened context; append
        ``completion.as_segment()`` to the context to record it as a trainable turn.
        """
        prompt_ids = segments_to_prompts(contexts)
        vocab = self._vocab_size()
        for i, ids in enumerate(prompt_ids):
            if not ids:
                raise ValueError(f"context {i} has no tokens")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"context {i}: token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        return self._generate_checked(prompt_ids, n, max_new_tokens, temperature, top_p, stop, greedy, seed, ignore_eos)

    def update_weights(self, model: Any) -> None:
        """Make the engine sample from ``model``'s current weights (call after each optimizer step)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- backend hooks

    def _vocab_size(self) -> int:
        raise NotImplementedError

    def _generate_ids(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float, top_p: float,
                      stop: list[str], greedy: bool, seed: Optional[int], ignore_eos: bool) -> list[list[Completion]]:
        raise NotImplementedError

    def _generate_checked(self, prompt_ids, n, max_new_tokens, temperature, top_p, stop, greedy, seed, ignore_eos):
        max_new_tokens = self.cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = self.cfg.temperature if temperature is None else float(temperature)
        top_p = self.cfg.top_p if top_p is None else float(top_p)
        stops = validate_sampling(n, max_new_tokens, temperature, top_p, stop)
        if not prompt_ids:
            return []
        return self._generate_ids(prompt_ids, n, max_new_tokens, temperature, top_p, stops, bool(greedy), seed, ignore_eos)


# name (rollout.backend) -> a RolloutEngine subclass (or a factory(cfg, model, tokenizer)), or "module:Class"
# imported when a run names it (unifiedplayers.rollout registers the built-ins so: vLLM stays unimported).
ROLLOUT_ENGINES = Registry("rollout engine", "rollout.backend")


def register_rollout_engine(name: str):
    """Class (or factory) decorator: build it for ``rollout.backend: name`` (a name already taken is refused)."""
    return ROLLOUT_ENGINES.register(name)
