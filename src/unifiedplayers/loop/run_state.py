"""A run's state on disk (:mod:`unifiedplayers.loop.outer`): :class:`RunState` to and from ``state.pt``, atomic
writes, and the config a resumed run must share with the run it continues (:func:`check_resumable`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from unifiedplayers import rundir
from unifiedplayers.precision import matches_stored
from unifiedplayers.rundir import count_lines, load_state, truncate_lines

# Config keys that may change when a run is resumed: they steer this process, not the result (``machine`` records
# where each start ran; trainer.offload_dir holds only files without a name, read back bit-exactly).
RUN_CONTROL_KEYS = ("resume", "run_dir", "logger", "schedule.max_updates", "schedule.print_summary",
                    "schedule.checkpoint_retention", "schedule.save_every", "schedule.export_at_end", "capacity",
                    "machine", "trainer.offload_dir")


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def result_config(cfg: Any) -> dict[str, Any]:
    """The composed config minus the run-control keys: what must not change when a run is resumed."""
    return _without_control(_without_unused(_flatten(OmegaConf.to_container(cfg, resolve=True))))


def _without_control(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` without the run-control keys (a run saved before a key became one stored it)."""
    return {k: v for k, v in flat.items() if not any(k == c or k.startswith(c + ".") for c in RUN_CONTROL_KEYS)}


def _without_unused(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` without keys its model does not read: the tiny_random architecture's sizes of any other source (null
    now; a run directory written before held the tiny defaults there, and resumes)."""
    from unifiedplayers.config import TINY_RANDOM_ARCHITECTURE

    if flat.get("model.source") == "tiny_random":
        return flat
    return {k: v for k, v in flat.items() if not (k.startswith("model.") and k[6:] in TINY_RANDOM_ARCHITECTURE)}


def is_schema_default(key: str, value: Any) -> bool:
    """Whether ``value`` is the typed schema's default for ``key``: a setting added to the code after a run
    started, left at its default, is no change to that run (it behaves as before)."""
    from unifiedplayers.config import typed_schema

    try:
        default = OmegaConf.select(typed_schema(), key, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation or a node without a default: treat as a change
        return False
    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default, resolve=False)
    return default is not None and default == value


@dataclass
class RunState:
    """Where a run stands after its last completed update; ``state.pt`` holds it as of the last save."""

    completed: int = 0
    records: int = 0  # lines of records.jsonl of completed updates (a resume cuts the rest and replays them)
    metrics: int = 0  # the same of metrics.jsonl
    checkpoints: dict[str, Optional[str]] = field(default_factory=dict)  # each player's last, relative to the run dir
    published: dict[str, Optional[str]] = field(default_factory=dict)  # each player's stale-feedback copy
    question_history: list[str] = field(default_factory=list)
    block_questions: list[str] = field(default_factory=list)
    phase: Optional[int] = None  # the first update of a phase in progress (its minibatches are in phase.pt)
    prompt_counter: int = 0
    finished: bool = False
    wandb_id: Optional[str] = None
    timing: dict[str, float] = field(default_factory=lambda: {
        "generation_s": 0.0, "sandbox_s": 0.0, "update_s": 0.0, "checkpoint_s": 0.0, "model_load_s": 0.0,
        "pool_s": 0.0})

    def to_dict(self, versions: dict[str, Any], published_versions: dict[str, Any], method_state: Any,
                total_updates: int, world_size: int, cfg: Any) -> dict[str, Any]:
        """The state as ``state.pt`` holds it (with the RNG states, the players' versions and the config)."""
        from unifiedplayers.trainer import capture_rng_state

        return {
            "completed": self.completed, "records": self.records, "metrics": self.metrics,
            "checkpoints": dict(self.checkpoints), "published": dict(self.published), "versions": versions,
            "published_versions": published_versions, "question_history": list(self.question_history),
            "block_questions": list(self.block_questions), "phase": self.phase,
            "prompt_counter": self.prompt_counter, "rng": capture_rng_state(), "finished": self.finished,
            "total_updates": total_updates, "wandb_id": self.wandb_id, "world_size": world_size,
            "timing": dict(self.timing), "method_loop": method_state, "config": result_config(cfg),
            "format": rundir.RUN_FORMAT,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "RunState":
        """The state saved by :meth:`to_dict` (also by the runs of earlier versions; model load time is not carried)."""
        out = cls(completed=state["completed"], records=state["records"], metrics=state["metrics"],
                  checkpoints=dict(state["checkpoints"]), published=dict(state["published"]),
                  question_history=list(state["question_history"]),
                  block_questions=list(state.get("block_questions", [])), phase=state.get("phase"),
                  prompt_counter=state["prompt_counter"], finished=state["finished"], wandb_id=state.get("wandb_id"))
        out.timing.update({k: v for k, v in state.get("timing", {}).items() if k != "model_load_s"})
        return out


def is_schema_key(key: str) -> bool:
    """Whether the typed schema has ``key`` (a key under a free-form mapping, such as ``method.extra``, counts)."""
    from unifiedplayers.config import check_override_keys

    try:
        check_override_keys([f"{key}=0"])
    except ValueError:
        return False
    return True


def check_resumable(state: dict[str, Any], cfg: Any, run_dir: Path, world_size: int) -> None:
    """Refuse to resume a run written by another rank count or with another config (the run-control keys aside), and
    one written by an older version of this code whose config holds keys this version does not have."""
    if state.get("world_size", 1) != world_size:
        raise ValueError(
            f"{run_dir} holds a run of {state.get('world_size', 1)} rank(s); resume it with as many "
            f"(this process has {world_size}): each rank's sampling seeds depend on the rank count")
    now = result_config(cfg)
    then = _without_control(_without_unused(state["config"]))
    diff = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k)
                  and not (k not in then and is_schema_default(k, now[k]))
                  and not matches_stored(k, now.get(k), then.get(k)))  # dtype auto: the run keeps its dtype
    gone = [k for k in diff if k not in now and not is_schema_key(k)]
    if gone:
        raise ValueError(
            f"{run_dir} holds a run written by an older version of this code: its config has keys this version does "
            f"not ({', '.join(gone[:8])}{' ...' if len(gone) > 8 else ''}), so it cannot be resumed; start a new run "
            "in another run_dir")
    if diff:
        shown = ", ".join(f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in diff[:8])
        raise ValueError(
            f"{run_dir} holds a run with a different config ({shown}{' ...' if len(diff) > 8 else ''}); "
            "resume it with the same settings, or start a fresh run in another run_dir"
        )


def saved_state(run_dir: Path, cfg: Any, world_size: int, restart: bool = True) -> Optional[dict[str, Any]]:
    """The run state saved in ``run_dir`` (None for a new run), checked before anything is written or loaded: a run
    there is never overwritten without ``resume=true``, and resumes only with this version's format and the same
    config. A run stopped before its first save restarts from its first update, its lines cut (``restart``; false:
    only check, as the command line does before a launch)."""
    path = run_dir / rundir.STATE
    state = load_state(path) if path.exists() else None
    if state is not None and not cfg.resume:
        raise FileExistsError(
            f"{run_dir} already holds a run ({state['completed']}/{state['total_updates']} updates). "
            "Pass resume=true to continue it, or choose another run_dir (or delete it) to start fresh.")
    if state is not None:
        run_format = state.get("format", 1)  # a state.pt without it was written before formats were numbered
        if run_format != rundir.RUN_FORMAT:
            raise ValueError(
                f"{run_dir} holds a run written by another version of this code (run format {run_format}; "
                f"this version writes format {rundir.RUN_FORMAT}, whose files name or mean some things differently), "
                "so it cannot be resumed; finish it with that version, or start a new run in another run_dir")
        check_resumable(state, cfg, run_dir, world_size)
        return state
    begun = {name: count_lines(run_dir / name) for name in (rundir.RECORDS, rundir.METRICS)}
    if any((run_dir / name).exists() and (run_dir / name).stat().st_size for name in begun):
        if not cfg.resume:
            raise FileExistsError(
                f"{run_dir} already holds a run that stopped before its first save ({begun[rundir.RECORDS]} "
                "record(s), no state.pt). Pass resume=true to restart it from its first update, or choose another "
                "run_dir (or delete it) to start fresh.")
        if restart:
            for name in begun:
                truncate_lines(run_dir / name, 0)
            (run_dir / rundir.PHASE).unlink(missing_ok=True)
            print(f"[resume] {run_dir} stopped before its first save: restarting it from the first "
                  f"update (dropped {begun[rundir.RECORDS]} record(s) and {begun[rundir.METRICS]} metrics line(s))")
    return None


def restore(state: dict[str, Any], run_dir: Path, team: Any, method: Any, current: RunState) -> tuple[RunState, Any]:
    """Bring a fresh process to the state after the last save: records and metrics cut to it, the phase in progress,
    every player's checkpoint, the RNG states, the method's state. Returns (run state, phase); the outer loop restores
    the iteration's π_ref and published weights (``Team.resume_iteration``)."""
    from unifiedplayers.loop.phase import Phase, load_phase_state

    dropped_r = truncate_lines(run_dir / rundir.RECORDS, state["records"])
    dropped_m = truncate_lines(run_dir / rundir.METRICS, state["metrics"])
    if dropped_r or dropped_m:
        print(f"[resume] dropped {dropped_r} record(s) and {dropped_m} metrics line(s) written after the last save "
              "(their updates are replayed)")
    run = RunState.from_dict(state)
    run.checkpoints = {**current.checkpoints, **run.checkpoints}
    run.published = {**current.published, **run.published}
    run.timing["model_load_s"] = current.timing["model_load_s"]
    phase = None
    if state.get("phase") is not None:  # stopped inside a phase: its sampled minibatches, as saved
        saved = load_phase_state(run_dir / rundir.PHASE)
        if saved["first"] != state["phase"]:
            raise RuntimeError(f"{run_dir / rundir.PHASE} holds phase {saved['first']}, the state names "
                               f"phase {state['phase']}")
        phase = Phase.from_state(saved)
    team.restore(run_dir, state["versions"], run.checkpoints)
    team.restore_rng(state["rng"])
    if state.get("method_loop") is not None:
        method.load_state_dict(state["method_loop"])  # Socratic-Zero: curriculum, failures
    print(f"[resume] continuing {run_dir} after update {run.completed}/{state['total_updates']} (its last save)")
    return run, phase


def write_state(state: RunState, path: Path, team: Any, method: Any, total_updates: int, world_size: int,
                cfg: Any) -> None:
    """``state.pt``, atomically, with the players' versions, the method's state and the RNG states."""
    atomic_torch_save(state.to_dict({r: p.version for r, p in team.players.items()},
                                    {r: p.published_version for r, p in team.players.items()}, method.state_dict(),
                                    total_updates, world_size, cfg), path)
