"""A trained player in the Hugging Face format, for ``vllm serve``, lm-eval-harness and the Hub:

    python -m unifiedplayers.export RUN_DIR --role execution --out DIR
    python -m unifiedplayers.export RUN_DIR --role all --out DIR          # every trained player, DIR/<role>
    python -m unifiedplayers.export RUN_DIR --format adapter              # an adapter run: PEFT's adapter format

The player's last checkpoint (the one ``state.pt`` names) is loaded into the run's backbone (``config.yaml``'s
``model``, on CPU) and written with ``save_pretrained`` beside its tokenizer and ``unifiedplayers_export.json``.
``--dtype``: default the run's ``model.dtype``, bfloat16 where it is ``auto``; only parameters are cast.

An adapter run (``trainer.lora.rank`` > 0) exports ``merged`` (the adapter folded into the weights in float32, then
cast) or ``adapter``, PEFT's format, whose base is the run's ``model.path`` or, without one, ``DIR/base``.
``schedule.export_at_end`` runs the same code at the end of a run (docs/running.md, "The run directory").
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import OmegaConf

from unifiedplayers.models import load_model, resolve_dtype, save_model_dir
from unifiedplayers.precision import DTYPE_NAMES
from unifiedplayers.roles import ROLES
from unifiedplayers.rundir import CONFIG, EXPORT, MODEL_WEIGHTS, STATE, TRAINER_STATE, load_state
from unifiedplayers import lora

EXPORT_META = "unifiedplayers_export.json"
FORMATS = ("merged", "adapter")


class ExportError(Exception):
    """Nothing to export where asked; the message says what is there."""


def read_run(run_dir: Path) -> tuple[dict[str, Any], Any]:
    """(run state, run config) of the run in ``run_dir``."""
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run directory")
    missing = [name for name in (STATE, CONFIG) if not (run_dir / name).is_file()]
    if missing:
        raise ExportError(f"{run_dir} holds no {' or '.join(missing)}: not a training run directory, or a run "
                          "that stopped before its first save (it has no checkpoint yet)")
    try:
        return load_state(run_dir / STATE), OmegaConf.load(run_dir / CONFIG)
    except RuntimeError as err:  # load_state's message names the file and how to recover
        raise ExportError(str(err)) from None


def exported_roles(state: dict[str, Any]) -> list[str]:
    """The players the run state names a checkpoint for (the trained ones), in block order."""
    return [r for r in ROLES if state["checkpoints"].get(r)]


def player_checkpoint(run_dir: Path, state: dict[str, Any], role: str) -> Path:
    """The directory of ``role``'s last checkpoint, holding its ``model.pt``."""
    if role not in ROLES:
        raise ExportError(f"unknown role {role!r}: one of {', '.join(ROLES)} or all")
    rel = state["checkpoints"].get(role)
    trained = ", ".join(exported_roles(state)) or "none"
    if not rel:
        raise ExportError(f"{run_dir} has no checkpoint of the {role} player (not trained in this run, or not "
                          f"yet saved); players with one: {trained}")
    if not (run_dir / rel / MODEL_WEIGHTS).is_file():
        raise ExportError(f"{run_dir / rel} holds no model.pt (removed by schedule.checkpoint_retention?); "
                          f"nothing to export for the {role} player")
    return run_dir / rel


def export_dtype(run_cfg: Any, dtype: Optional[str]) -> str:
    """``dtype`` when given, else the run's sampling dtype (``model.dtype``), else bfloat16 (``auto``)."""
    name = dtype or str(OmegaConf.select(run_cfg, "model.dtype", default="auto"))
    if dtype is None and name not in DTYPE_NAMES:
        name = "bfloat16"
    if name not in DTYPE_NAMES:
        raise ExportError(f"--dtype {name!r}: one of {', '.join(DTYPE_NAMES)}")
    return name


@functools.lru_cache(maxsize=1)
def git_commit() -> Optional[str]:
    """The commit of the code that exports (None outside a git checkout); asked once a process."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip() if out.returncode == 0 else ""
    return commit or None


def export_player(run_dir: str | os.PathLike, role: str, out: str | os.PathLike,
                  dtype: Optional[str] = None, run: Optional[tuple[dict[str, Any], Any]] = None,
                  fmt: str = "merged") -> Path:
    """Write ``role``'s last checkpoint of the run in ``run_dir`` to ``out`` (the module docstring), whole or not at
    all, replacing an earlier export there. ``run``: the run's (state, config) when the caller has read them."""
    run_dir, out = Path(run_dir).expanduser(), Path(out).expanduser()
    state, run_cfg = run or read_run(run_dir)
    ckpt = player_checkpoint(run_dir, state, role)
    name = export_dtype(run_cfg, dtype)
    adapters = lora.enabled(OmegaConf.select(run_cfg, "trainer", default={}))
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "adapter" and not adapters:
        raise ExportError(f"--format adapter: the run in {run_dir} trained every parameter (trainer.lora.rank=0), "
                          "it has no adapter; export --format merged")
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / EXPORT_META).is_file())):
        raise ExportError(f"{out} exists and is not an export of this tool: choose another --out")
    t0 = time.perf_counter()
    weights = torch.load(ckpt / MODEL_WEIGHTS, map_location="cpu", weights_only=True, mmap=True)
    if adapters:  # merged in float32, then cast; or the adapter in PEFT's format beside the backbone it needs
        model, tokenizer = _adapter_model(run_cfg, weights, name, merge=fmt == "merged")
    else:  # The backbone the run trained, on CPU, in the export dtype (parameters only: inv_freq stays float32).
        model, tokenizer = load_model(OmegaConf.merge(run_cfg.model, {"device": "cpu", "dtype": name}))
        model.load_state_dict(weights)  # strict: a checkpoint of another backbone fails here, naming the keys
    model.config.dtype = resolve_dtype(name)  # config.json's dtype: what vLLM serves in by default
    trainer_state = _trainer_state(ckpt)
    version = state.get("versions", {}).get(role) or {}
    meta = {
        "run_dir": str(run_dir.resolve()), "role": role, "source_checkpoint": str(ckpt.resolve()),
        "outer_iteration": trainer_state.get("outer_iteration", version.get("outer_iteration")),
        "global_step": trainer_state.get("global_step", version.get("step")),
        "run_updates_completed": state["completed"], "run_finished": bool(state["finished"]), "dtype": name,
        "model": str(run_cfg.model.name), "method": str(OmegaConf.select(run_cfg, "method.name", default="")),
        "format": fmt if adapters else "full",
        "git_commit": git_commit(), "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"  # beside out, so the rename is atomic
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)  # the umask's mode (mkdtemp's 0700 would hide the export from other users)
    try:
        if fmt == "adapter":
            _save_adapter(model, tokenizer, run_cfg, tmp, out)
        else:
            save_model_dir(model, tokenizer, str(tmp))
        (tmp / EXPORT_META).write_text(json.dumps(meta, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[export] {role} ({ckpt.relative_to(run_dir)}, {name}) -> {out} in {time.perf_counter() - t0:.1f}s")
    return out


def _adapter_model(run_cfg: Any, weights: dict[str, torch.Tensor], dtype: str, merge: bool) -> tuple[Any, Any]:
    """The run's backbone (float32, CPU) with the checkpoint's adapter: folded in and cast to ``dtype`` (``merge``),
    or still an adapter player."""
    from unifiedplayers.trainer.precision import cast_parameters

    base, tokenizer = load_model(OmegaConf.merge(run_cfg.model, {"device": "cpu", "dtype": "float32"}))
    player = lora.add_adapter(lora.share_base(base), run_cfg.trainer.lora)
    try:
        lora.load_policy_state(player, weights)
    except ValueError as err:
        raise ExportError(f"the checkpoint's adapter does not fit the run's trainer.lora: {err}") from None
    if not merge:
        return player, tokenizer
    base.load_state_dict(lora.merged_state(player))
    return cast_parameters(base, resolve_dtype(dtype)), tokenizer


def _save_adapter(player: Any, tokenizer: Any, run_cfg: Any, tmp: Path, out: Path) -> None:
    """``player``'s adapter in PEFT's format, and the tokenizer, into ``tmp`` (to become ``out``)."""
    path = OmegaConf.select(run_cfg, "model.path", default=None)
    if not path:  # the embedded or tiny backbone: no directory of its own for PEFT or vLLM to load
        base, base_tokenizer = load_model(OmegaConf.merge(run_cfg.model, {"device": "cpu"}))
        save_model_dir(base, base_tokenizer, str(tmp / "base"))
    lora.save_peft_adapter(player, str(tmp), base_model=str(path or out / "base"))
    tokenizer.save_pretrained(str(tmp))


def _trainer_state(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.pt`` (the player's step and outer iteration), {} when thinned away."""
    path = ckpt / TRAINER_STATE
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else {}


def export_run(run_dir: str | os.PathLike, role: str = "all", out: Optional[str | os.PathLike] = None,
               dtype: Optional[str] = None, fmt: str = "merged") -> list[Path]:
    """Export ``role`` to ``out`` (default ``RUN_DIR/export/<role>``), or with ``role="all"`` every player the run
    state names a checkpoint for that still holds its weights, each to ``out/<role>`` (default ``RUN_DIR/export``)."""
    run_dir = Path(run_dir).expanduser()
    if role != "all":
        return [export_player(run_dir, role, out or run_dir / EXPORT / role, dtype, fmt=fmt)]
    run = read_run(run_dir)  # read once for every player (config.yaml's parse is ~0.1 s)
    roles = exported_roles(run[0])
    if not roles:
        raise ExportError(f"{run_dir} has no checkpoint of any player (no player trained, or none saved yet)")
    # A finished run's retention may have kept some players' weights only (execution_weights): export those.
    thinned = [r for r in roles if not (run_dir / run[0]["checkpoints"][r] / MODEL_WEIGHTS).is_file()]
    if thinned == roles:
        player_checkpoint(run_dir, run[0], roles[0])  # raises, naming the missing model.pt
    if thinned:
        print(f"[export] skipped {', '.join(thinned)}: schedule.checkpoint_retention kept no model.pt of theirs")
    roles = [r for r in roles if r not in thinned]
    root = Path(out).expanduser() if out else run_dir / EXPORT
    return [export_player(run_dir, r, root / r, dtype, run, fmt) for r in roles]


def export_at_end(run_dir: Path) -> None:
    """``schedule.export_at_end``; a failure is reported, not raised: the run is complete, its checkpoints on disk."""
    try:
        export_run(run_dir)
    except Exception as err:  # noqa: BLE001 - the run itself succeeded; say how to retry
        print(f"[export] the end-of-run export failed ({type(err).__name__}: {err}); retry it with "
              f"`python -m unifiedplayers.export {run_dir} --role all`", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    """The command line (module docstring); an :class:`ExportError` exits with its message, not a traceback."""
    usage = "\n\n".join(__doc__.split("\n\n")[:2])  # the module docstring's first lines: what, and the commands
    ap = argparse.ArgumentParser(prog="python -m unifiedplayers.export", description=usage,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a training run directory (holding state.pt and config.yaml)")
    ap.add_argument("--role", default="execution", help=f"{' | '.join(ROLES)} | all (default: execution)")
    ap.add_argument("--out", default=None, help="output directory (all: one sub-directory per role); "
                                                "default RUN_DIR/export[/<role>]")
    ap.add_argument("--dtype", default=None, help=f"{' | '.join(DTYPE_NAMES)}; default: the run's model.dtype, "
                                                  "bfloat16 where it is auto")
    ap.add_argument("--format", default="merged", choices=FORMATS,
                    help="a run of adapter players (trainer.lora.rank > 0): merged, the backbone with the adapter "
                         "folded in (default), or adapter, PEFT's adapter format")
    args = ap.parse_args(argv)
    try:
        return export_run(args.run_dir, args.role, args.out, args.dtype, args.format)
    except ExportError as err:
        raise SystemExit(f"[export] {err}") from None


if __name__ == "__main__":
    main()
