"""The run's one rank boundary: rank 0 drives, the other ranks follow (a single controller).

Rank 0 runs the whole outer loop as single-process code: sampling, feedback, minibatches, records, metrics,
checkpoints and the run state. Its team is a :class:`Leader`. Each call of the leader that every rank must make is
first sent to the other ranks (one broadcast of its name and arguments), then run on rank 0:

- the team's calls that can be collectives of the trainer or the engine (:data:`TEAM_CALLS`): the update, the π_old
  pass, reading a player's weights into its engine (:meth:`Leader.engine`), π_ref's reset, publishing, block
  start and end, a block's diagnostics, saving and loading checkpoints;
- generation split by prompt (:meth:`Leader.split`): each rank runs a picklable job (what to generate and
  with which seeds) on its block of the prompts, with its own engine and sandbox, and rank 0 gathers the results in
  prompt order (:meth:`~unifiedplayers.distributed.DistContext.split_prompts`); the diagnostic pool's questions
  are split the same way (:meth:`Leader.pool_split`);
- the RNG states a resume restores.

The other ranks run :meth:`Follower.follow`: wait for the next call, run it with their own team, sandbox and
engines, until rank 0 sends :data:`STOP`. They hold no run state, read no run file and write none. While rank 0
works alone (verdicts, rewards, the pool's grading) they wait at the broadcast of the next call, and the
watchdog's heartbeat (:mod:`unifiedplayers.watchdog`) tells a rank that waits from one that hangs.

With one process (:data:`~unifiedplayers.distributed.SINGLE`) nothing is sent and every call runs here.
:func:`run` is the only place that asks which rank this is.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from unifiedplayers.diagnostics.execution_pool import evaluate_pool
from unifiedplayers.trainer import capture_rng_state, restore_rng_state

# Team methods every rank runs, in the order rank 0 calls them (each may be a collective of the trainer or engine).
TEAM_CALLS = ("start_iteration", "start_block", "update", "recompute_old_logprobs", "block_diagnostics",
              "end_block", "save_checkpoint", "restore", "resume_iteration")
START, STOP = "start", "stop"  # the first and last messages of a run


def run(dist: Any, lead: Callable[[], dict[str, Any]], follow: Callable[[dict[str, Any]], dict[str, Any]]
        ) -> dict[str, Any]:
    """Rank 0: ``lead()``; another rank: ``follow(start)`` once rank 0 sent its :meth:`Leader.start` message, or rank
    0's :meth:`Leader.stop` result when it stops before (a run already complete)."""
    if dist.is_main:
        return lead()
    op, args, _ = dist.broadcast(None)
    if op == STOP:
        return {**args[0], "rank": dist.rank}
    if op != START:
        raise RuntimeError(f"rank {dist.rank} expected the run's start from rank 0, got {op!r}")
    return follow(args[0])


class Leader:
    """Rank 0's team (see the module docstring): the team's methods named in ``calls`` are sent to every rank first;
    every other attribute is the team's own (``players``, ``tokenizer``, ``sampler`` ...), read on rank 0 only."""

    def __init__(self, dist: Any, team: Any, calls: tuple[str, ...] = TEAM_CALLS) -> None:
        self.dist, self.team, self.calls = dist, team, calls
        self.held: dict[tuple[str, str], Any] = {}  # (role, active) -> the engine engine() last returned

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("calls", ()):
            def both(*args: Any, **kwargs: Any) -> Any:
                self.send(name, *args, **kwargs)
                return getattr(self.team, name)(*args, **kwargs)
            return both
        return getattr(self.team, name)

    def send(self, op: str, *args: Any, **kwargs: Any) -> None:
        """Tell the other ranks to run ``op`` with these arguments (nothing with one process)."""
        if self.dist.enabled:
            self.dist.broadcast((op, args, kwargs))

    # ------------------------------------------------------------------ the run's ends
    def start(self, stored_config: Optional[dict[str, Any]], completed: int) -> None:
        """The other ranks may set up: the resumed run's stored config (its dtypes), the update this start begins with."""
        self.send(START, {"stored_config": stored_config, "completed": completed})

    def stop(self, completed: int, finished: bool) -> None:
        """The other ranks leave their loop and return ``{"completed", "finished", "rank"}``."""
        self.send(STOP, {"completed": completed, "finished": finished})

    # ------------------------------------------------------------------ calls with rank 0's side in them
    def start_iteration(self, run_dir: Any, published: dict[str, Optional[str]]) -> None:
        """π_ref reset and stale copies on every rank; rank 0 alone writes the published files."""
        self.send("start_iteration", None, {})
        self.team.start_iteration(run_dir, published)

    def engine(self, role: str, active: str) -> tuple[Any, dict[str, Any]]:
        """The engine ``role`` samples with while ``active`` trains, on every rank (the weights read into it can be a
        collective); each rank keeps it for the :meth:`split` calls that name ``(role, active)``."""
        self.send("engine", role, active)
        engine, ver = self.team.engine(role, active)
        self.held[(role, active)] = engine
        return engine, ver

    def restore_rng_state(self, state: dict[str, Any]) -> None:
        """The run's RNG states (a resume) on every rank."""
        self.send("restore_rng_state", state)
        restore_rng_state(state)

    def split(self, job: Callable[..., list[list[Any]]], engine: tuple[str, str], num_prompts: int,
              sandbox: Any) -> list[list[Any]]:
        """``job(engine, sandbox, tokenizer, prompts)`` over the ranks by prompt, with each rank's engine for
        ``engine`` = (role, active) (:meth:`engine`) and its sandbox: every prompt's samples in prompt order.
        ``job`` is sent to the other ranks, so it is picklable (a module-level class with its arguments)."""
        self.send("split", job, engine, num_prompts)
        run_job = _bound(job, self.held[engine], sandbox, self.team.tokenizer)
        return self.dist.split_prompts(run_job, num_prompts, to_all=False)

    def pool_split(self, execution_cfg: Any, pool_cfg: Any, questions: list[Any]) -> Callable[..., Any]:
        """The ``split`` of :func:`~unifiedplayers.diagnostics.execution_pool.evaluate_pool` for the diagnostic pool's
        ``questions``: once called, every rank answers its block of them with the Execution engine
        (``engine("execution", "execution")``)."""
        def split(generate: Callable[[range], list[list[Any]]], num_prompts: int, to_all: bool = False) -> Any:
            self.send("pool", execution_cfg, pool_cfg, questions)
            return self.dist.split_prompts(generate, num_prompts, to_all=to_all)
        return split


def _bound(job: Callable[..., list[list[Any]]], engine: Any, sandbox: Any, tokenizer: Any
           ) -> Callable[[range], list[list[Any]]]:
    return lambda prompts: job(engine, sandbox, tokenizer, prompts)


class Follower:
    """A rank but 0: runs rank 0's calls on its own ``team`` and ``sandbox`` until :data:`STOP` (``calls``: the team
    methods its :class:`Leader` sends)."""

    def __init__(self, dist: Any, team: Any, sandbox: Any, calls: tuple[str, ...] = TEAM_CALLS) -> None:
        self.dist, self.team, self.sandbox, self.calls = dist, team, sandbox, calls
        self.held: dict[tuple[str, str], Any] = {}

    def follow(self) -> dict[str, Any]:
        """Run rank 0's calls in its order; returns its :meth:`Leader.stop` message with this rank."""
        while True:
            op, args, kwargs = self.dist.broadcast(None)
            if op == STOP:
                return {**args[0], "rank": self.dist.rank}
            if op in self.calls:
                getattr(self.team, op)(*args, **kwargs)
            elif op == "engine":
                self.held[args] = self.team.engine(*args)[0]
            elif op == "split":
                job, engine, num_prompts = args
                self.dist.split_prompts(_bound(job, self.held[engine], self.sandbox, self.team.tokenizer),
                                        num_prompts, to_all=False)
            elif op == "pool":
                self._pool(*args)
            elif op == "restore_rng_state":
                restore_rng_state(*args)
            else:
                raise RuntimeError(f"rank {self.dist.rank} got an unknown call from rank 0: {op!r}")

    def _pool(self, execution_cfg: Any, pool_cfg: Any, questions: list[Any]) -> None:
        """This rank's block of the diagnostic pool, greedy; the run's RNG streams do not notice it (as on rank 0)."""
        rng = capture_rng_state()
        evaluate_pool(self.held[("execution", "execution")], self.sandbox, self.team.tokenizer, execution_cfg,
                      pool_cfg, questions, split=self.dist.split_prompts)
        restore_rng_state(rng)
