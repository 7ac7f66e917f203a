"""Wall time by stage, measured where the stage runs: ``with clock("generation"):`` adds the seconds spent in the
block, less those of the stages opened inside it, to ``clock.seconds["generation"]`` (so the tool calls made while
sampling, :class:`unifiedplayers.loop.engines.TimedSandbox`, count as sandbox time, never as generation)."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class StageClock:
    """Exclusive wall seconds per stage name (``seconds``), added up over the run of one process."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._nested: list[float] = []  # per open stage: seconds spent in the stages opened inside it

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            total = time.perf_counter() - start
            self.seconds[name] += total - self._nested.pop()
            if self._nested:
                self._nested[-1] += total

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """Seconds per stage since ``before`` (a copy of ``seconds`` taken earlier)."""
        return {name: s - before.get(name, 0.0) for name, s in self.seconds.items()}
