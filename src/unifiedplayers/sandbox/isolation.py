"""Which isolation layers a sandbox got, and why any is missing (:func:`isolation_report`); the layers, the
mechanisms (root, user namespace, none) and ``sandbox.require_isolation``: docs/sandbox.md. Imports nothing of the
project.
"""
from __future__ import annotations

from typing import Any, Mapping

# The layers, in the order they are reported, and what model-written code may do without each. A sandbox has one
# of the two process layers, uid (root) or pidns (a user namespace).
LAYERS = {
    "netns": "it may use the network, but for TCP where Landlock (ABI 4 or later) blocks it",
    "uid": "it runs as this process's user, reaching that user's files and processes, and descendants that leave "
           "its process group are not bounded or swept",
    "pidns": "the processes it starts are not bounded in number (they are still swept with its cell's PID namespace)",
    "landlock": "it may read and write files outside its working directory",
    "tmpfs": "its working directory is on disk, what all calls write together not capped",
}
MECHANISMS = {"root": "as root", "user namespace": "through a user namespace", "none": "not root, no user namespace"}


class IsolationWarning(UserWarning):
    """A run's sandbox lacks an isolation layer (``sandbox=strict`` refuses to start instead)."""


def expected_layers(isolation: Mapping[str, Any]) -> list[str]:
    """The layers a sandbox of this mechanism can have, in report order: its process layer is ``pidns`` in a user
    namespace, else ``uid`` (also for a run recorded before the mechanism was)."""
    other = "uid" if isolation.get("mechanism") == "user namespace" else "pidns"
    return [layer for layer in LAYERS if layer != other]


def switched_off(config: Any) -> dict[str, str]:
    """The layers a :class:`SandboxConfig` switches off, each with its key."""
    off = {"netns": ("sandbox.network=true", config.network),
           "uid": ("sandbox.drop_privileges=false", not config.drop_privileges),
           "pidns": ("sandbox.user_namespace=false", not getattr(config, "user_namespace", True)),
           "landlock": ("sandbox.landlock=false", not config.landlock),
           "tmpfs": ("sandbox.workdir_tmpfs_mb=0", not config.workdir_tmpfs_mb)}
    return {layer: f"switched off by {key}" for layer, (key, is_off) in off.items() if is_off}


def isolation_report(config: Any, isolation: Mapping[str, Any]) -> dict[str, Any]:
    """``{"mechanism": ..., "present": [layers], "missing": {layer: reason}}`` of a started ``Sandbox.isolation``."""
    off, reasons = switched_off(config), isolation.get("reasons") or {}
    layers = expected_layers(isolation)
    missing = {layer: off.get(layer) or reasons.get(layer) or "unavailable on this machine (no reason given)"
               for layer in layers if not isolation.get(layer)}
    mechanism = isolation.get("mechanism") or ("root" if isolation.get("uid") else "none")
    return {"mechanism": mechanism, "present": [layer for layer in layers if isolation.get(layer)],
            "missing": missing}


def isolation_line(report: Mapping[str, Any]) -> str:
    """``netns, uid, landlock, tmpfs (all layers, as root)``, or the layers present, the mechanism and
    ``MISSING landlock: <why>; tmpfs: <why>``."""
    present = ", ".join(report.get("present") or []) or "no layer"
    how = MECHANISMS.get(report.get("mechanism"), "")
    missing = "; ".join(f"{layer}: {why}" for layer, why in (report.get("missing") or {}).items())
    if not missing:
        return present + (f" (all layers, {how})" if how else " (all layers)")
    return present + (f" ({how})" if how else "") + f"; MISSING {missing}"


def missing_layer_warnings(report: Mapping[str, Any]) -> list[str]:
    return [f"sandbox isolation: layer {layer!r} is missing ({why}): {LAYERS[layer]}"
            for layer, why in (report.get("missing") or {}).items()]
