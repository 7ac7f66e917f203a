"""One run over several processes (GPUs): rank 0 runs the outer loop, the other ranks follow its calls.

Launched with ``torchrun`` (:mod:`unifiedplayers.launch`) or any launcher that sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; without them :func:`init_distributed` returns :data:`SINGLE` and
nothing here does anything. Who does what on which rank, the timeouts and the watchdog: docs/distributed.md.
The process group's timeout is long (``UNIFIEDPLAYERS_DIST_TIMEOUT_MIN``, 120 minutes) because the other ranks wait
while rank 0 builds the feedback alone; hangs are found by :mod:`unifiedplayers.watchdog`.
"""
from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

T = TypeVar("T")
_OBJECT_GROUP: Any = None  # a gloo group for the object collectives when the default group is nccl
_GROUP_ADOPTED = False  # an in-process vLLM engine took the job's process group over (see adopt_group)
_WATCHDOG: Any = None  # this rank's unifiedplayers.watchdog.Watchdog, while it is in a job


def adopt_group() -> None:
    """Note that an in-process vLLM engine adopted the job's process group: its shutdown at exit destroys every
    process group, and fails if :func:`destroy` already did, so :func:`destroy` then leaves them to it."""
    global _GROUP_ADOPTED
    _GROUP_ADOPTED = True


def waiting(name: str) -> Any:
    """A context for the collective ``name``: while this rank waits in it, its watchdog tells the other ranks, which
    end the job when every rank waits at a collective and not all at the same kind."""
    return _WATCHDOG.at_collective(name) if _WATCHDOG is not None else nullcontext()


def share(n: int, rank: int, world_size: int) -> int:
    """How many of ``n`` items rank ``rank`` takes: n // N, plus one for the first n mod N ranks."""
    return n // world_size + (1 if rank < n % world_size else 0)


def prompt_shard(num_prompts: int, rank: int, world_size: int) -> range:
    """The prompts rank ``rank`` of ``world_size`` generates for: a contiguous block of :func:`share` prompts,
    so that the ranks' blocks, in rank order, are the prompts in order."""
    start = rank * (num_prompts // world_size) + min(rank, num_prompts % world_size)
    return range(start, start + share(num_prompts, rank, world_size))


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run. The default (rank 0 of 1) makes every method a no-op."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------ object collectives
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the others' argument is ignored)."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        with waiting("broadcast"):
            dist.broadcast_object_list(box, src=0, group=_OBJECT_GROUP)
        return box[0]

    def gather(self, obj: Any) -> Optional[list[Any]]:
        """Every rank's ``obj`` in rank order on rank 0; ``None`` on the others."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: Optional[list[Any]] = [None] * self.world_size if self.is_main else None
        with waiting("gather"):
            dist.gather_object(obj, out, dst=0, group=_OBJECT_GROUP)
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        with waiting("all_gather"):
            dist.all_gather_object(out, obj, group=_OBJECT_GROUP)
        return out

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            with waiting("barrier"):
                dist.barrier(group=_OBJECT_GROUP)

    # ------------------------------------------------------------------ split sampling
    def split_prompts(self, generate: Callable[[range], list[list[T]]], num_prompts: int,
                      to_all: bool = True) -> Optional[list[list[T]]]:
        """Split one generation call over the ranks by prompt: ``generate(prompts)`` returns ``out[i][sample]`` for
        the range ``prompts`` (not called for an empty one). Every prompt's samples in prompt order, on every rank
        (``to_all``) or on rank 0 only (``None`` elsewhere)."""
        if not self.enabled:
            return generate(range(num_prompts))
        mine = prompt_shard(num_prompts, self.rank, self.world_size)
        local = generate(mine) if len(mine) else []
        parts = self.all_gather(local) if to_all else self.gather(local)
        if parts is None:
            return None
        return [row for part in parts for row in part]

    # ------------------------------------------------------------------ data-parallel gradients
    def all_reduce_gradients(self, parameters: Sequence[Any], bucket_elems: int = 50_000_000) -> None:
        """Sum the gradients of ``parameters`` over the ranks (a parameter without one counts as zeros). Each
        micro-batch's loss already carries the whole batch's Eq. 21 weights, so the sum is the full batch's gradient.
        """
        if not self.enabled:
            return
        import torch
        import torch.distributed as dist

        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[Any, list[Any]] = {}
        for p in params:
            by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group in by_dtype.values():
            bucket: list[Any] = []
            size = 0
            for i, p in enumerate(group):
                bucket.append(p)
                size += p.grad.numel()
                if size >= bucket_elems or i == len(group) - 1:
                    flat = torch.cat([q.grad.reshape(-1) for q in bucket])
                    with waiting("all_reduce of the gradients"):
                        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                    for q, summed in zip(bucket, flat.split([q.grad.numel() for q in bucket])):
                        q.grad.copy_(summed.view_as(q.grad))
                    bucket, size = [], 0


SINGLE = DistContext()


RENDEZVOUS_KEYS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def without_rendezvous(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the rendezvous variables, for a child process that starts its own process group (the
    parent's ``MASTER_PORT`` is already in use)."""
    return {k: v for k, v in env.items() if k not in RENDEZVOUS_KEYS}


def _listed_gpus() -> list[str]:
    """The node's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (else nvidia-smi's indices), read without starting CUDA
    (which would fix the visible devices for good)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in out.stdout.splitlines() if x.strip()] if out.returncode == 0 else []


def _pin_gpu(local_rank: int) -> None:
    """Make the GPU of ``local_rank`` this process's only GPU, before CUDA starts: ``CUDA_VISIBLE_DEVICES`` narrowed
    to it and ``LOCAL_RANK=0`` (docs/distributed.md, "Devices"). :attr:`DistContext.local_rank` keeps the launcher's
    value."""
    devices = _listed_gpus()
    if not devices:
        return
    if len(devices) > 1:
        if local_rank >= len(devices):
            raise RuntimeError(f"LOCAL_RANK={local_rank} but only {len(devices)} GPUs are visible")
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]
    os.environ["LOCAL_RANK"] = "0"


def init_distributed(backend: Optional[str] = None, pin_gpu: bool = True) -> DistContext:
    """:data:`SINGLE` without a launcher or with ``WORLD_SIZE=1``, else a joined process group (``backend``, else
    ``nccl`` where CUDA is available, else ``gloo``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if pin_gpu and backend != "gloo":
        _pin_gpu(local_rank)
    import torch
    import torch.distributed as dist

    global _OBJECT_GROUP
    timeout = timedelta(minutes=float(os.environ.get("UNIFIEDPLAYERS_DIST_TIMEOUT_MIN", "120")))
    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # the GPU DeepSpeed picks too
        dist.init_process_group(backend=chosen, timeout=timeout)
    if dist.get_backend() == "nccl" and _OBJECT_GROUP is None:
        _OBJECT_GROUP = dist.new_group(backend="gloo", timeout=timeout)  # pickled objects travel on the host
    global _WATCHDOG
    if _WATCHDOG is None and dist.is_initialized():
        from unifiedplayers import watchdog

        _WATCHDOG = watchdog.start(rank, world)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank)


def destroy(ctx: DistContext) -> None:
    """Leave the job's process group (every rank, once, from a ``finally``; an adopted group is left to its engine).
    Called while an exception is on its way out, it leaves at once (:func:`leave_failed`): a barrier would wait for
    ranks that are at another collective, until the process group's timeout."""
    if not ctx.enabled:
        return
    error = sys.exc_info()[1]
    if error is not None and not (isinstance(error, SystemExit) and error.code in (0, None)):
        leave_failed(ctx, error)
        return
    import torch.distributed as dist

    global _OBJECT_GROUP, _WATCHDOG
    if dist.is_initialized():
        with waiting("the barrier at the end"):
            dist.barrier(group=_OBJECT_GROUP)
    if _WATCHDOG is not None:  # after the barrier, which a hung rank would keep the others at
        _WATCHDOG.stop()
        _WATCHDOG = None
    if dist.is_initialized():
        if _GROUP_ADOPTED:
            return
        dist.destroy_process_group()
    _OBJECT_GROUP = None


def leave_failed(ctx: DistContext, error: BaseException) -> None:
    """This rank's run raised ``error``: say so and post it as the job's failure note, so that every other rank ends
    within seconds (:mod:`unifiedplayers.watchdog`). The process group is left as it is: the process is ending."""
    text = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    global _WATCHDOG
    first = f"rank {ctx.rank}: {text}"
    if _WATCHDOG is not None:
        try:
            first = _WATCHDOG.post_failure(text)
        except Exception:  # noqa: BLE001 - the store is gone too: the launcher still sees this rank fail
            pass
        _WATCHDOG.stop()  # its watch would end this process on its own note, maybe before the traceback is out
        _WATCHDOG = None
    after = "" if first == f"rank {ctx.rank}: {text}" else f", after {first}"
    print(f"[rank {ctx.rank}] failed: {text}{after}; leaving the job", file=sys.stderr, flush=True)


def ranks_on_this_node(dist: DistContext, env: Mapping[str, str] = os.environ) -> int:
    """torchrun's ``LOCAL_WORLD_SIZE``; without it every rank of the job, so that a node's ranks never count on more
    of its cores than it has."""
    return int(env.get("LOCAL_WORLD_SIZE") or dist.world_size)


def sandbox_config(sandbox_cfg: Any, dist: "DistContext", env: Mapping[str, str] = os.environ) -> Any:
    """The sandbox settings of one rank: with ``sandbox.workers=0`` (one per core) the ranks of a node share its
    cores (:func:`ranks_on_this_node`)."""
    if dist.enabled and sandbox_cfg.workers == 0:
        from omegaconf import OmegaConf

        return OmegaConf.merge(sandbox_cfg,
                               {"workers": max(2, 2 * (os.cpu_count() or 1) // ranks_on_this_node(dist, env))})
    return sandbox_cfg


SHARED_CHECK_WAIT_S = 60.0  # a network filesystem may show another node's new file late (NFS: up to its acdirmax)


def check_shared_directory(dist: DistContext, directory: Any, wait_s: float = SHARED_CHECK_WAIT_S) -> None:
    """Stop the run on every rank unless every rank sees ``directory`` (the run directory) as one shared filesystem:
    rank 0 writes a random nonce there, which every rank must read within ``wait_s`` seconds; the error names the
    node and rank of each that could not (docs/distributed.md, "Across nodes")."""
    if not dist.enabled:
        return
    import secrets
    import socket
    from pathlib import Path

    here, note = Path(directory), None
    if dist.is_main:
        note = (secrets.token_hex(16), "")
        try:
            here.mkdir(parents=True, exist_ok=True)
            (here / f".shared-check-{note[0]}").write_text(note[0])
        except OSError as err:
            note = (note[0], f"rank 0 could not write there ({err})")
    nonce, problem = dist.broadcast(note)
    probe = here / f".shared-check-{nonce}"
    seen = not problem and _reads(probe, nonce, wait_s)
    ranks = dist.all_gather((seen, socket.gethostname(), dist.rank, str(here)))
    if dist.is_main:
        probe.unlink(missing_ok=True)
    if problem or not all(r[0] for r in ranks):
        raise RuntimeError(shared_directory_error(ranks, problem))


def _reads(path: Any, text: str, wait_s: float) -> bool:
    """Whether ``path`` holds ``text``, looking every 0.2 s for up to ``wait_s`` seconds."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if path.read_text() == text:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def shared_directory_error(ranks: Sequence[tuple[bool, str, int, str]], problem: str = "") -> str:
    """``ranks``: each rank's (saw the file, host, rank, directory)."""
    _, host0, _, directory = ranks[0]
    if problem:
        return f"the run directory {directory} cannot be checked on node {host0}: {problem}"
    failed = [f"node {host} (rank {rank}{'' if d == directory else f', looking in {d}'})"
              for seen, host, rank, d in ranks if not seen]
    return (f"the run directory {directory} is not one filesystem shared by every node of the job: "
            f"{', '.join(failed)} could not read the file that rank 0 wrote there on node {host0}. Every rank loads "
            "the run's checkpoints from it: put run_dir on a filesystem that every node mounts at the same path "
            "(docs/distributed.md, \"Across nodes\")")
