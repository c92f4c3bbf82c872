"""How the planner's reasons and warnings write sizes and counts (binary GiB, 1.5B-style counts)."""

from __future__ import annotations


GIB = 1 << 30


def gib_text(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n != float("inf") else "no limit"


def cap_gib_text(cap: int | None) -> str:
    """The device capacity, or why there is none: an unknown size is not 0 GiB."""
    return gib_text(cap) if cap is not None else "unknown memory (not read by the profile: not checked)"


def count_text(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"
