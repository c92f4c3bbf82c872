"""One spelling for every duration trainfit shows: seconds below 90 s, minutes below 90 min, hours
above; never an exponent ("1.1e+03 s"), never "0 min", never "0.0833333 h"."""

from __future__ import annotations

import math


def _trim(text: str) -> str:
    """'2.0' -> '2': a whole number is written without its decimal."""
    return text[:-2] if text.endswith(".0") else text


def duration_text(seconds: float | None) -> str:
    """0.31 s, 4.15 s, 25.8 s, 4.5 min, 80 min, 2 h, 4.6 h, 1,520 h."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = max(0.0, float(seconds))
    if seconds == 0:
        return "0 s"
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.3g} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{_trim(f'{minutes:.1f}')} min" if minutes < 10 else f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 100:
        return f"{_trim(f'{hours:.1f}')} h"
    return f"{hours:,.0f} h"


def hours_text(hours: float | None) -> str:
    """duration_text for a figure in hours."""
    return duration_text(None if hours is None else hours * 3600)
