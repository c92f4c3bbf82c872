"""A closed (or half-open) range of valid numbers, and how a value outside it is worded.

One class for the bounds of the run config's keys and command-line flags (trainfit.validate.BOUNDS)
and of the declared knob table (trainfit.core.knobs): a leaf module, so both can import it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trainfit.errors import short_repr

_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


@dataclass(frozen=True)
class Bound:
    """A closed range [low, high] (open at `low` when low_open: 'greater than low')."""

    low: float
    high: float
    integer: bool = True
    low_open: bool = False
    # Integers may be written as sizes: 8m, 1.5b (token and example counts).
    sizes: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low_open:
            return f"{kind} greater than {_fmt(self.low)} and at most {_fmt(self.high)}"
        return f"{kind} from {_fmt(self.low)} to {_fmt(self.high)}"

    def problem(self, value: Any) -> str | None:
        """Why `value` is not valid here, or None when it is."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be {self.describe()}, got {_show(value)}"
        if self.integer and not isinstance(value, int):
            return f"must be {self.describe()}, got {_show(value)}"
        if not math.isfinite(value):
            return f"must be {self.describe()}, got {value}"
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high:
            return f"must be {self.describe()}, got {_show(value)}"
        return None

    def parse(self, text: str) -> int | float:
        """A command-line value; ValueError with the valid range when it is not one."""
        text = text.strip()
        if not text.isascii():  # int() reads '١' and '１' as digits; a typo more likely than intent
            raise ValueError(f"must be {self.describe()} in ASCII digits, got {_show(text)}")
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            value = _size(text) if self.sizes else None  # type: ignore[assignment]
            if value is None:
                raise ValueError(f"must be {self.describe()}, got {_show(text)}") from None
        why = self.problem(value)
        if why:
            raise ValueError(why)
        return value


def _size(text: str) -> int | None:
    m = _SIZE.match(text)
    if not m:
        return None
    value = float(m.group(1).replace("_", "")) * _MULT[m.group(2).lower()]
    return int(round(value)) if math.isfinite(value) else None


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 1e16:
        return f"{int(x):,}"
    return f"{x:g}"


def _show(value: Any) -> str:
    return short_repr(value)
