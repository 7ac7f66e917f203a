"""The players' rollout engines (:class:`RolloutEngines`) and the timed sandbox, as :mod:`unifiedplayers.loop.team`
uses them."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

from unifiedplayers.diagnostics.timing import StageClock


class TimedSandbox:
    """Forwards to a sandbox; each call is the stage ``sandbox`` of the run's :class:`StageClock` (``clock``)."""

    def __init__(self, sandbox: Any, clock: Optional[StageClock] = None) -> None:
        self.sandbox = sandbox
        self.clock = clock if clock is not None else StageClock()

    def _timed(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self.clock("sandbox"):
            return getattr(self.sandbox, name)(*args, **kwargs)

    def run(self, *a: Any, **k: Any) -> Any:
        return self._timed("run", *a, **k)

    def run_many(self, *a: Any, **k: Any) -> Any:
        return self._timed("run_many", *a, **k)

    def call(self, *a: Any, **k: Any) -> Any:
        return self._timed("call", *a, **k)

    def call_many(self, *a: Any, **k: Any) -> Any:
        return self._timed("call_many", *a, **k)


class RolloutEngines:
    """Rollout engines for the players' weights: one per model object for a backend that samples from the module
    (``samples_from_module``: hf); else one engine whose weights are swapped in (``update_weights``), read inside
    ``gather()`` (a trainer's :meth:`gathered_weights`: under ZeRO-3 a collective, so every rank asks for the same
    engines in the same order)."""

    def __init__(self, rollout_cfg: Any, tokenizer: Any, build: Optional[Callable[..., Any]] = None) -> None:
        from unifiedplayers.rollout import build_rollout, engine_class

        self._build = build or build_rollout
        self._per_module = bool(getattr(engine_class(rollout_cfg), "samples_from_module", False))
        self.cfg = rollout_cfg
        self.tokenizer = tokenizer
        self._engines: dict[int, Any] = {}
        self._keys: dict[int, Any] = {}  # hf: the checkpoint name each module's engine last sampled
        self._shared: Any = None
        self._loaded: Any = None
        self._asleep = False

    def engine(self, model: Any, key: Any,
               gather: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> Any:
        if self._per_module:
            if id(model) not in self._engines:
                self._engines[id(model)] = self._build(self.cfg, model, self.tokenizer)
            engine = self._engines[id(model)]
            if self._keys.get(id(model)) != key:  # new weights in the same module: no stored prompt prefix holds
                self._keys[id(model)] = key
                getattr(engine, "forget_prefixes", lambda: None)()
            return engine
        if self._asleep:
            self._shared.wake_up()
            self._asleep = False
        if self._shared is None:
            with gather():
                self._shared = self._build(self.cfg, model, self.tokenizer)
            self._loaded = key
        elif self._loaded != key:
            with gather():
                self._shared.update_weights(model)
            self._loaded = key
        return self._shared


    def sleep(self) -> None:
        """The trainer is about to work: a shared engine with ``rollout.sleep_level`` > 0 frees its GPU memory until it
        samples again (level 2: its weights too, so whatever samples next is copied in)."""
        level = int(getattr(self.cfg, "sleep_level", 0) or 0)
        if self._shared is None or level == 0 or self._asleep:
            return
        self._shared.sleep()
        self._asleep = True
        if level == 2:
            self._loaded = None

    def built(self) -> list[Any]:
        """The engines built so far: one per module (hf), or the one shared engine (vLLM)."""
        return [*self._engines.values(), *([self._shared] if self._shared is not None else [])]


class SamplingTemperature:
    """A rollout engine whose default sampling temperature is one player's, set per call: the engine may be shared."""

    def __init__(self, engine: Any, temperature: float) -> None:
        self.engine = engine
        self.temperature = float(temperature)

    def _t(self, temperature: Optional[float], greedy: bool) -> Optional[float]:
        return None if greedy else (self.temperature if temperature is None else temperature)

    def generate(self, *args: Any, temperature: Optional[float] = None, **kwargs: Any) -> Any:
        return self.engine.generate(*args, temperature=self._t(temperature, kwargs.get("greedy", False)), **kwargs)

    def continue_segments(self, *args: Any, temperature: Optional[float] = None, **kwargs: Any) -> Any:
        return self.engine.continue_segments(
            *args, temperature=self._t(temperature, kwargs.get("greedy", False)), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
