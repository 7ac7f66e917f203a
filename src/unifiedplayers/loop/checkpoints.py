"""The run's checkpoints (``checkpoints/``; the layout: docs/running.md, "The run directory"): what a save writes
and what ``schedule.checkpoint_retention`` keeps. When a save falls: :func:`unifiedplayers.schedule.save_due`.
The in-block checkpoint alternates between ``resume/<role>-a`` and ``-b``, so the run state always names a complete
one.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from unifiedplayers import rundir


def save_active(team: Any, role: str, iteration: int, block_end: bool, run_dir: Path,
                checkpoints: dict[str, Optional[str]], every_block: bool) -> None:
    """The active player's checkpoint: named at a block end (``block_end``), else the resume copy the state does not
    use; ``checkpoints`` (role -> path) names it for the player and a shared model's other role."""
    trainer = team.players[role].trainer
    if block_end and every_block:
        rel = rundir.block_checkpoint(iteration, role)
    else:
        current = checkpoints.get(role) or ""
        rel = rundir.resume_checkpoint(role, "b" if current.endswith("-a") else "a")
    team.save_checkpoint(role, run_dir / rel)  # on every rank: rank 0 writes, or every rank its shards
    for other, player in team.players.items():  # a shared model's other role points at the same weights
        if other == role or (player.trainer is trainer and other in team.shared_roles):
            checkpoints[other] = str(rel)


def thin_at_block_end(run_dir: Path, role: str, checkpoints: dict[str, Optional[str]], keep: str) -> None:
    """At a block end, once the state is written: drop the role's in-block copies the state no longer names, and thin
    every block-end checkpoint it no longer names as a finished run's (only a named one is ever resumed from)."""
    for name in ("a", "b"):
        rel = str(rundir.resume_checkpoint(role, name))
        if checkpoints.get(role) != rel:
            shutil.rmtree(run_dir / rel, ignore_errors=True)
    used = {str(Path(p)) for p in checkpoints.values() if p}
    for ckpt in rundir.block_checkpoints(run_dir):
        if str(ckpt.relative_to(run_dir)) not in used:
            _thin(ckpt, keep)


def prune(run_dir: Path, keep: str) -> None:
    """Apply ``schedule.checkpoint_retention`` (``keep``) to a finished run's checkpoints (idempotent)."""
    root = run_dir / rundir.CHECKPOINTS
    if keep == "all" or not root.is_dir():
        return
    for group in sorted(p for p in root.iterdir() if p.is_dir()):
        if group == run_dir / rundir.PUBLISHED:  # stale feedback's copies: used while the run goes on only
            shutil.rmtree(group, ignore_errors=True)
            continue
        for ckpt in sorted(p for p in group.iterdir() if p.is_dir()):
            _thin(ckpt, keep)


def _thin(ckpt: Path, keep: str) -> None:
    """One checkpoint (``iter<N>/<role>`` or ``resume/<role>-a|b``) as ``keep`` says: all of it; its weights
    (``model.pt``) without the optimizer state and π_ref; the Execution player's weights only."""
    if keep == "all":
        return
    if keep == "execution_weights" and ckpt.name.split("-")[0] != "execution":
        shutil.rmtree(ckpt, ignore_errors=True)
        return
    for name in (rundir.OPTIMIZER, rundir.REFERENCE):
        (ckpt / name).unlink(missing_ok=True)
    if (ckpt / rundir.MODEL_WEIGHTS).is_file():  # a DeepSpeed checkpoint's resume state (its optimizer
        shutil.rmtree(ckpt / rundir.DEEPSPEED, ignore_errors=True)  # partitions); model.pt stays
