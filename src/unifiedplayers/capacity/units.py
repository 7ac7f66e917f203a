"""The units of a capacity plan, and its one number formatter."""
from __future__ import annotations

GiB, GB, TB = float(2**30), 1e9, 1e12


def count(x: float) -> str:
    """A count to three significant figures with a decimal prefix: 4.02B, 135M, 21.4k, 768 (B for a billion)."""
    for unit, name in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if float(f"{x:.3g}") >= unit:
            return f"{x / unit:.3g}{name}"
    return f"{x:.0f}"
