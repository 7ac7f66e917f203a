"""The run's one rank boundary: rank 0 drives, the other ranks follow (a single controller).

Rank 0 runs the whole outer loop as single-process code. A team method that every rank must run (a collective, or
generation split by prompt) is declared so where it is defined, with :func:`every_rank`: called on rank 0, its name
and arguments are first broadcast to the other ranks, then it runs on rank 0. The other ranks run :func:`follow`
until rank 0 sends :data:`STOP`; they hold no run state and touch no run file (docs/distributed.md). With one process
nothing is sent. This module is the only place that asks which rank this is.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

START, STOP = "start", "stop"  # the first and last messages of a run


def every_rank(method: Callable[..., Any]) -> Callable[..., Any]:
    """Declares a method of a team (an object with a ``dist``) that every rank runs: on rank 0 it is sent to the
    other ranks before it runs; :func:`follow` runs only methods declared so. One such method never calls another."""
    @functools.wraps(method)
    def sent_first(team: Any, *args: Any, **kwargs: Any) -> Any:
        if team.dist.is_main:
            send(team.dist, method.__name__, *args, **kwargs)
        return method(team, *args, **kwargs)

    sent_first.every_rank = True  # type: ignore[attr-defined]
    return sent_first


def send(dist: Any, op: str, *args: Any, **kwargs: Any) -> None:
    """Tell the other ranks to run ``op`` with these arguments (nothing with one process)."""
    if dist.enabled:
        dist.broadcast((op, args, kwargs))


def start(dist: Any, stored_config: Optional[dict[str, Any]], completed: int) -> None:
    """The other ranks may set up: the resumed run's stored config (its dtypes), the update this start begins with."""
    send(dist, START, {"stored_config": stored_config, "completed": completed})


def stop(dist: Any, completed: int, finished: bool) -> None:
    """The other ranks leave :func:`follow` and return ``{"completed", "finished", "rank"}``."""
    send(dist, STOP, {"completed": completed, "finished": finished})


def run(dist: Any, lead: Callable[[], dict[str, Any]], follow_start: Callable[[dict[str, Any]], dict[str, Any]]
        ) -> dict[str, Any]:
    """Rank 0: ``lead()``; another rank: ``follow_start(start)`` once rank 0 sent its :func:`start` message, or rank
    0's :func:`stop` message when it stops before (a run already complete)."""
    if dist.is_main:
        return lead()
    op, args, _ = dist.broadcast(None)
    if op == STOP:
        return {**args[0], "rank": dist.rank}
    if op != START:
        raise RuntimeError(f"rank {dist.rank} expected the run's start from rank 0, got {op!r}")
    return follow_start(args[0])


def follow(dist: Any, team: Any) -> dict[str, Any]:
    """A rank but 0: run rank 0's calls on ``team``, in its order; returns its :func:`stop` message with this rank."""
    while True:
        op, args, kwargs = dist.broadcast(None)
        if op == STOP:
            return {**args[0], "rank": dist.rank}
        method = getattr(type(team), op, None)
        if not getattr(method, "every_rank", False):
            raise RuntimeError(f"rank {dist.rank} got a call from rank 0 that is not declared every_rank: {op!r}")
        method(team, *args, **kwargs)
