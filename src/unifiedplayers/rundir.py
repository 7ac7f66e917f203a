"""The run directory: the name of every file and folder a run writes, and the one reader of its JSON-lines files.

What each file holds: docs/running.md, "The run directory". The loop, diagnostics/, export.py, eval/analysis/ and
ablations/ take the names from here, so a file is renamed in one place. This module imports nothing of the
package, so any part of it (and any tool beside it) can read a run.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Union

PathLike = Union[str, os.PathLike]

CONFIG = "config.yaml"  # the composed config, resolved
HYDRA_CONFIG = ".hydra/config.yaml"  # Hydra's own copy
STATE = "state.pt"
# The format of what a run writes, stored in its state.pt (none: 1). It goes up when a file of a run changes its
# names or their meaning, and a run of another format is not resumed (loop.run_state.saved_state).
RUN_FORMAT = 2
PHASE = "phase.pt"  # the sampled minibatches of the phase in progress
RECORDS = "records.jsonl"
METRICS = "metrics.jsonl"
EXECUTION_POOL = "execution_pool.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
SUMMARY_PNG = "summary.png"
CHECKPOINTS = "checkpoints"
PUBLISHED = f"{CHECKPOINTS}/published"  # stale feedback's copies
EXPORT = "export"
WANDB = "wandb"
PROBES = "probes"
ANALYSIS = "analysis"
EVAL = "eval"

# Inside one checkpoint directory.
MODEL_WEIGHTS = "model.pt"  # the full weights, what eval/ and the export read
OPTIMIZER = "optimizer.pt"
REFERENCE = "reference.pt"
TRAINER_STATE = "trainer_state.pt"
RNG_STATE = "rng_state.pt"
DEEPSPEED = "deepspeed"  # a DeepSpeed backend's partitions


def block_checkpoint(iteration: int, role: str) -> Path:
    """The player's checkpoint at the end of its block of outer iteration ``iteration``, relative to the run."""
    return Path(CHECKPOINTS) / f"iter{iteration}" / role


def resume_checkpoint(role: str, copy: str) -> Path:
    """The in-block checkpoint copy ``copy`` ("a" or "b") of ``role``, relative to the run."""
    return Path(CHECKPOINTS) / "resume" / f"{role}-{copy}"


def block_checkpoints(run_dir: Path) -> list[Path]:
    """Every end-of-block checkpoint directory of the run (``checkpoints/iter*/*``), sorted."""
    return sorted(p for p in (Path(run_dir) / CHECKPOINTS).glob("iter*/*") if p.is_dir())


def iter_jsonl(path: PathLike) -> Iterator[dict[str, Any]]:
    """The JSON objects of a run's JSONL file, one per line, in order, streamed. Every line is written whole, so only
    the last can be torn (a process killed while writing it): skipped with a RuntimeWarning when it lacks its newline
    and does not parse. A line that does not parse anywhere else is corruption: ``ValueError`` naming the line."""
    path = Path(path)
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            obj = _parse(raw)
            if isinstance(obj, dict):
                yield obj
            elif not raw.endswith(b"\n"):  # only the last line can lack its newline
                warnings.warn(f"{path}: skipping a torn last line (line {n})", RuntimeWarning, stacklevel=2)
                return
            else:
                raise ValueError(f"{path}:{n}: not a JSON object")


def repair_tail(path: PathLike) -> None:
    """Make a JSONL file end on a line boundary before appending to it: a last line without its newline is
    completed when it is a whole JSON object (the newline alone was lost) and cut off otherwise (torn)."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        start = max(0, size - (1 << 20))
        while True:  # find the start of the last line
            f.seek(start)
            chunk = f.read(size - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0 or start == 0:
                line_start = start + cut + 1
                break
            start = max(0, start - (1 << 20))
        f.seek(line_start)
        if isinstance(_parse(f.read()), dict):
            f.write(b"\n")
        else:
            warnings.warn(f"{path}: dropping a torn last line ({size - line_start} bytes) before appending",
                          RuntimeWarning, stacklevel=3)
            f.truncate(line_start)
        f.flush()
        os.fsync(f.fileno())


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_jsonl(path: PathLike, missing_ok: bool = False) -> list[dict[str, Any]]:
    """:func:`iter_jsonl` as a list; ``missing_ok``: a file that does not exist reads as no line."""
    if missing_ok and not Path(path).exists():
        return []
    return list(iter_jsonl(path))


def count_lines(path: PathLike) -> int:
    """Complete lines of a JSONL file (a torn last line does not count)."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def truncate_lines(path: PathLike, keep: int) -> int:
    """Cut ``path`` back to its first ``keep`` complete lines (resume); returns the lines dropped."""
    path = Path(path)
    if not path.exists():
        if keep:
            raise ValueError(f"{path} is missing but the run state counts {keep} lines in it")
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        lines = data.count(b"\n")
        if lines < keep:
            raise ValueError(f"{path} has {lines} complete lines but the run state counts {keep}: it was truncated")
        cut = 0
        for _ in range(keep):
            cut = data.index(b"\n", cut) + 1
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return lines - keep


def load_state(path: PathLike) -> dict[str, Any]:
    """``state.pt``; a file that does not read is an error that names it and says how to recover."""
    import torch

    path = Path(path)
    try:
        state = torch.load(path, weights_only=False)
        if not isinstance(state, dict) or "completed" not in state:
            raise ValueError("not a run state")
        return state
    except Exception as err:  # noqa: BLE001 - an empty, truncated or foreign file
        raise RuntimeError(
            f"{path} cannot be read ({type(err).__name__}: {err}). It is the run state of {path.parent}; to restart "
            f"that run from its first update, delete it (rm {path}) and run again with resume=true (its records are "
            "cut and rewritten), or start a new run in another run_dir") from None
