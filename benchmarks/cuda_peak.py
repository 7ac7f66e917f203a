"""Where a CUDA peak goes: ``Recorder`` records the caching allocator's history (Python frames) around a piece of
work; ``breakdown`` replays it from the bytes allocated before (the baseline) to its highest point and groups the
blocks live there by allocation site, so the capacity plan's items can be compared with what the device held.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

PACKAGES = ("unifiedplayers", "deepspeed", "transformers")


def _short(frame: Mapping[str, Any]) -> Optional[str]:
    path = str(frame.get("filename", "")).replace("\\", "/")
    for pkg in PACKAGES:
        cut = path.rfind(f"/{pkg}/")
        if cut >= 0:
            return f"{path[cut + 1:]}:{frame.get('line', '?')} {frame.get('name', '?')}"
    return None


def site_of(frames: Sequence[Mapping[str, Any]]) -> str:
    """The allocation's site from its frames (innermost first): the innermost frame in one of PACKAGES, and where
    that is not ours, ``< `` the innermost of ours; ``torch`` where no such frame was recorded."""
    named = [s for s in map(_short, frames) if s is not None]
    if not named:
        return "torch (no frame of ours, DeepSpeed's or transformers')"
    first = named[0]
    if first.startswith("unifiedplayers/"):
        return first
    ours = next((s for s in named if s.startswith("unifiedplayers/")), None)
    return f"{first} < {ours}" if ours else first


def breakdown(entries: Iterable[Mapping[str, Any]], baseline: int, top: int = 12) -> dict:
    """Replay ``entries`` (the allocator's trace: ``alloc`` and ``free_completed`` change the total) from
    ``baseline`` allocated bytes. Returns the peak, the entry index it was reached at, the bytes allocated before
    the recording that were still live there, and the ``top`` sites by bytes live at the peak (the rest summed)."""
    entries = list(entries)
    total = peak = baseline
    at = -1
    sizes: dict[int, int] = {}
    for i, e in enumerate(entries):
        action, addr, size = e.get("action"), e.get("addr"), int(e.get("size", 0))
        if action == "alloc":
            sizes[addr] = size
            total += size
            if total > peak:
                peak, at = total, i
        elif action == "free_completed":
            total -= sizes.pop(addr, size)  # a block from before the recording leaves the baseline
    live: dict[int, tuple[int, str]] = {}
    old_freed = 0
    for e in entries[:at + 1]:
        action, addr, size = e.get("action"), e.get("addr"), int(e.get("size", 0))
        if action == "alloc":
            live[addr] = (size, site_of(e.get("frames") or ()))
        elif action == "free_completed":
            if addr in live:
                del live[addr]
            else:
                old_freed += size
    sites: dict[str, list[int]] = {}
    for size, site in live.values():
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
    return {"peak_bytes": peak, "peak_entry": at, "entries": len(entries),
            "baseline_live_bytes": baseline - old_freed,
            "sites": [{"site": s, "bytes": b, "blocks": n} for s, (b, n) in ranked[:top]],
            "other_bytes": sum(b for _, (b, _n) in ranked[top:])}


class Recorder:
    """The allocator's history from ``start()`` to ``stop()`` on one CUDA device; ``stop()`` returns
    ``breakdown`` of it, with ``wrapped`` true where the history outgrew ``max_entries`` (its start was lost, so
    the replay is not the whole of it)."""

    def __init__(self, device: Any, max_entries: int = 2_000_000) -> None:
        self.device, self.max_entries = device, max_entries
        self.baseline = 0

    def start(self) -> "Recorder":
        import torch

        torch.cuda.synchronize(self.device)
        self.baseline = int(torch.cuda.memory_allocated(self.device))
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=self.max_entries)
        return self

    def stop(self) -> dict:
        import torch

        torch.cuda.synchronize(self.device)
        try:
            snapshot = torch.cuda.memory._snapshot(self.device)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        index = torch.device(self.device).index or 0
        traces = snapshot.get("device_traces") or []
        entries = traces[index] if index < len(traces) else []
        result = breakdown(entries, self.baseline)
        result["wrapped"] = len(entries) >= self.max_entries
        result["baseline_bytes"] = self.baseline
        return result


def lines(result: Mapping[str, Any], mib: float = 2.0 ** 20) -> list[str]:
    """The breakdown as printed lines."""
    out = [f"allocator replay: peak {result['peak_bytes'] / mib:.1f} MiB at entry {result['peak_entry']} of "
           f"{result['entries']}{' (history wrapped: its start lost)' if result.get('wrapped') else ''}; "
           f"allocated before the recording and live there {result['baseline_live_bytes'] / mib:.1f} MiB"]
    out += [f"  {s['bytes'] / mib:9.1f} MiB {s['blocks']:5d} blocks  {s['site']}" for s in result["sites"]]
    if result["other_bytes"]:
        out.append(f"  {result['other_bytes'] / mib:9.1f} MiB               other sites")
    return out
