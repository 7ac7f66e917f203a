"""Which isolation layers a sandbox got, and why any is missing (:func:`isolation_report`). Imports nothing of
the project.

A layer is missing either because the config switched it off or because the machine cannot give it (not root,
a kernel without Landlock, a container that forbids namespaces); the server names the second kind in its ready
message (``isolation["reasons"]``). ``sandbox.require_isolation=true`` (``sandbox=strict``) refuses to start
without the first three layers; otherwise the calls run with the layers there are, and a run says which
(``unifiedplayers.machine``).
"""
from __future__ import annotations

from typing import Any, Mapping

# The layers, in the order they are reported, and what model-written code may do without each.
LAYERS = {
    "netns": "it may use the network, but for TCP where Landlock (ABI 4 or later) blocks it",
    "uid": "it runs as this process's user, reaching that user's files and processes, and descendants that leave "
           "its process group are not bounded or swept",
    "landlock": "it may read and write files outside its working directory",
    "tmpfs": "its working directory is on disk, what all calls write together not capped",
}


class IsolationWarning(UserWarning):
    """A run's sandbox lacks an isolation layer (``sandbox=strict`` refuses to start instead)."""


def switched_off(config: Any) -> dict[str, str]:
    """The layers the config itself switches off (``config``: a :class:`SandboxConfig`), each with the key."""
    off = {"netns": ("sandbox.network=true", config.network),
           "uid": ("sandbox.drop_privileges=false", not config.drop_privileges),
           "landlock": ("sandbox.landlock=false", not config.landlock),
           "tmpfs": ("sandbox.workdir_tmpfs_mb=0", not config.workdir_tmpfs_mb)}
    return {layer: f"switched off by {key}" for layer, (key, is_off) in off.items() if is_off}


def isolation_report(config: Any, isolation: Mapping[str, Any]) -> dict[str, Any]:
    """``{"present": [layers], "missing": {layer: reason in words}}`` of a started sandbox (``isolation``: its
    ``Sandbox.isolation``). Every missing layer has a reason."""
    off, reasons = switched_off(config), isolation.get("reasons") or {}
    missing = {layer: off.get(layer) or reasons.get(layer) or "unavailable on this machine (no reason given)"
               for layer in LAYERS if not isolation.get(layer)}
    return {"present": [layer for layer in LAYERS if isolation.get(layer)], "missing": missing}


def isolation_line(report: Mapping[str, Any]) -> str:
    """The report in one line: ``netns, uid, landlock, tmpfs (all layers)``, or the layers present and
    ``MISSING landlock: <why>; tmpfs: <why>``."""
    present = ", ".join(report.get("present") or []) or "no layer"
    missing = "; ".join(f"{layer}: {why}" for layer, why in (report.get("missing") or {}).items())
    return present + (f"; MISSING {missing}" if missing else " (all layers)")


def missing_layer_warnings(report: Mapping[str, Any]) -> list[str]:
    """One warning text per missing layer: the layer, why it is missing, what model-written code may do then."""
    return [f"sandbox isolation: layer {layer!r} is missing ({why}): {LAYERS[layer]}"
            for layer, why in (report.get("missing") or {}).items()]
