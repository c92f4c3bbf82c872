"""Byte units and the text of sizes and durations the monitor, its leak findings and the
dashboard print. Sizes are binary units, named as such (GiB = 2^30 bytes)."""

from __future__ import annotations

from typing import Any

MIB = 1 << 20
GIB = 1 << 30


def mib_text(n: float) -> str:
    """MiB with three significant digits (KiB under a tenth of one)."""
    return f"{n / MIB:.3g} MiB" if abs(n) >= MIB / 10 else f"{n / 1024:.3g} KiB"


def size_text(n: float) -> str:
    """Binary units, named as such (GiB = 2^30 bytes)."""
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / 1024:.0f} KiB"


def duration_text(seconds: float) -> str:
    """Seconds as s, min s, h min or days."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400 * 2:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s / 86400:.1f} days"


def shape_text(shape: Any) -> str:
    """A batch shape as "4 x 512"."""
    if isinstance(shape, (tuple, list)):
        return " x ".join(str(x) for x in shape)
    return str(shape)
