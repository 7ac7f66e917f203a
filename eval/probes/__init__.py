"""Held-out probes of the three players, and the Figure 1a reproduction built on them.

    python -m eval.probes backbone --run runs/X --out probes.json          # the backbone under run X's config
    python -m eval.probes runs/X/checkpoints/iter2 --roles execution       # one iteration's checkpoints
    python -m eval.probes.make_sets                                         # (re)make the fixed probe sets
    python -m eval.probes.figure1 --scale smoke --seeds 1                   # what `make reproduce-figure1` runs

From Python: :func:`eval.probes.probe` (below), or the pieces in :mod:`eval.probes.probes`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from eval.probes.probes import ROLES, ProbeSizes, find_run_config, resolve_checkpoint, run_probes


def load_config(target: str, run: Optional[str] = None, overrides: Sequence[str] = ()) -> Any:
    """The config a target is probed under: ``run``'s ``config.yaml``, else that of the run the target lies
    in, else the composed default config; ``overrides`` (Hydra-style ``key=value``) are set over it."""
    from omegaconf import OmegaConf

    from unifiedplayers import rundir
    from unifiedplayers.config import compose

    path = Path(run) / rundir.CONFIG if run else find_run_config(target)
    if path is None:
        return compose(list(overrides))
    if not path.is_file():
        raise FileNotFoundError(f"no config.yaml in {path.parent}: is it a run directory?")
    cfg = OmegaConf.load(path)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides))) if overrides else cfg


def probe(target: str, roles: Sequence[str] = ROLES, run: Optional[str] = None, overrides: Sequence[str] = (),
          sizes: Optional[ProbeSizes] = None, out: Optional[str] = None, log: Any = print) -> dict[str, Any]:
    """Probe ``target`` (``backbone``, a run, an iteration's or a role's checkpoint directory); write ``out``."""
    import json

    cfg = load_config(target, run, overrides)
    result = run_probes(cfg, resolve_checkpoint(target, roles), roles, sizes, log=log)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(out)
    return result
