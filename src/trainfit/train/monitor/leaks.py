"""Memory-leak detection (pure): readings of the memory at step ends, at one batch shape, fitted
with a Theil-Sen slope and Kendall's tau for consistency; a consistent rise with enough total
growth is a LeakFinding (the monitor's `memory_leak` event)."""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainfit.train.monitor.units import MIB, duration_text, mib_text, shape_text, size_text


@dataclass(frozen=True)
class LeakFinding:
    """A consistent rise of the memory read at step ends, at one batch shape."""

    bytes_per_step: float  # Theil-Sen slope over the window
    bytes_per_hour: float | None  # at the current step time (None when it is unknown)
    seconds_per_step: float | None
    growth_bytes: int  # since the first readings after the warm-up
    since_step: int
    current_bytes: int
    window_readings: int
    window_steps: int  # steps the window spans
    consistency: float  # Kendall's tau of the window: 1 = every later reading higher
    memory_kind: str  # "cuda_allocated" or "process_rss"
    shape: Any
    steps_to_full: float | None  # at this rate, steps until the free memory is used up

    def reason(self) -> str:
        what = {"cuda_allocated": "GPU memory allocated by torch",
                "process_rss": "process memory (RSS)"}.get(self.memory_kind, self.memory_kind)
        at = f" at the same batch shape ({shape_text(self.shape)})" if self.shape is not None else ""
        text = (f"{what} read at step ends rises {mib_text(self.bytes_per_step)} per step{at}, "
                f"consistently over the last {self.window_readings} readings ({self.window_steps} steps)")
        if self.bytes_per_hour is not None and self.seconds_per_step:
            text += f": about {size_text(self.bytes_per_hour)} per hour at {self.seconds_per_step:.3g} s per step"
        text += f"; +{size_text(self.growth_bytes)} since step {self.since_step}, now {size_text(self.current_bytes)}"
        if self.steps_to_full is not None:
            text += f"; the free memory runs out in about {self.steps_to_full:,.0f} steps at this rate"
            if self.seconds_per_step:
                text += f" (~{duration_text(self.steps_to_full * self.seconds_per_step)})"
        return text + (". A leak: tensors kept across steps (e.g. a loss appended to a list without .item()), "
                       "a growing cache, or a fragmenting allocator.")

    def details(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape) if isinstance(self.shape, tuple) else self.shape
        d["mib_per_step"] = round(self.bytes_per_step / MIB, 3)
        d["mib_per_hour"] = round(self.bytes_per_hour / MIB, 1) if self.bytes_per_hour is not None else None
        return d


def theil_sen(points: list[tuple[float, float]]) -> tuple[float | None, float]:
    """(median of the pairwise slopes, Kendall's tau) of (x, y) points. The slope ignores up to
    29 % of wild readings; tau is (rising pairs - falling pairs) / pairs, 1 for a strict rise."""
    slopes: list[float] = []
    rising = falling = 0
    n = len(points)
    for i in range(n):
        xi, yi = points[i]
        for j in range(i + 1, n):
            xj, yj = points[j]
            if xj == xi:
                continue
            slopes.append((yj - yi) / (xj - xi))
            if yj > yi:
                rising += 1
            elif yj < yi:
                falling += 1
    if not slopes:
        return None, 0.0
    return statistics.median(slopes), (rising - falling) / len(slopes)


class LeakDetector:
    """Memory read at step ends, one series per key (batch shape, memory kind).

    A series reports a leak when, after `warmup_steps` steps and with at least `min_points`
    readings in its window of the last `window` readings:
    * the rise is consistent: Kendall's tau >= `min_consistency` and a positive Theil-Sen slope;
    * it is large: the level (median of the last 5 readings) is above the baseline (median of
      the first 5 after the warm-up) by at least max(`min_growth_bytes`, `min_growth_fraction`
      x baseline);
    * it is still happening: the current slope, over the steps since the baseline, accounts for at
      least half of that growth (a jump early on followed by a flat line is not a leak);
    * its rate has settled: the slope of the window's second half is within 15 % of the window's.
    It is reported again only when the rate changes by more than `rate_change` (50 %).
    """

    def __init__(self, *, warmup_steps: int = 10, window: int = 50, min_points: int = 30,
                 min_growth_bytes: int = 64 * MIB, min_growth_fraction: float = 0.02,
                 min_consistency: float = 0.6, rate_change: float = 0.5) -> None:
        self.warmup_steps = warmup_steps
        self.window = window
        self.min_points = min(min_points, window)
        self.min_growth_bytes = min_growth_bytes
        self.min_growth_fraction = min_growth_fraction
        self.min_consistency = min_consistency
        self.rate_change = rate_change
        self._series: dict[Any, dict[str, Any]] = {}
        self._dirty: set[Any] = set()

    def add(self, step: int, value_bytes: int, key: Any = None) -> None:
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = {"first_step": step, "baseline": [], "reported": None,
                                     "window": collections.deque(maxlen=self.window)}
        if step < s["first_step"] + self.warmup_steps:
            return
        if len(s["baseline"]) < 5:
            s["baseline"].append((step, value_bytes))
        s["window"].append((step, value_bytes))
        self._dirty.add(key)

    @property
    def pending(self) -> bool:
        """Readings arrived since the last check."""
        return bool(self._dirty)

    def check(self, *, seconds_per_step: float | None = None,
              headroom_bytes: Callable[[str], int | None] | None = None) -> list[LeakFinding]:
        """Findings to report now (new leaks, or a leak whose rate changed materially) for the
        series that got readings since the last check."""
        out = []
        for key in list(self._dirty):
            self._dirty.discard(key)
            f = self._check_series(key, seconds_per_step, headroom_bytes)
            if f is not None:
                out.append(f)
        return out

    def _check_series(self, key: Any, seconds_per_step: float | None,
                      headroom_bytes: Callable[[str], int | None] | None) -> LeakFinding | None:
        s = self._series[key]
        window = list(s["window"])
        if len(window) < self.min_points:
            return None
        slope, tau = theil_sen(window)
        if slope is None or slope <= 0 or tau < self.min_consistency:
            return None
        base_step = s["baseline"][0][0]
        baseline = statistics.median(v for _, v in s["baseline"])
        level = statistics.median(v for _, v in window[-5:])
        growth = level - baseline
        if growth < max(self.min_growth_bytes, self.min_growth_fraction * baseline):
            return None
        last_step = window[-1][0]
        if slope * (last_step - base_step) < growth / 2:
            return None
        recent, _ = theil_sen(window[len(window) // 2:])
        if recent is None or abs(recent / slope - 1) > 0.15:
            return None  # the rate is changing: report it once it has settled
        reported = s["reported"]
        if reported is not None and abs(slope / reported - 1) <= self.rate_change:
            return None
        s["reported"] = slope
        kind = key[1] if isinstance(key, tuple) and len(key) == 2 else "memory"
        shape = key[0] if isinstance(key, tuple) and len(key) == 2 else None
        free = headroom_bytes(kind) if headroom_bytes else None
        per_hour = slope * 3600 / seconds_per_step if seconds_per_step else None
        return LeakFinding(
            bytes_per_step=slope, bytes_per_hour=per_hour, seconds_per_step=seconds_per_step,
            growth_bytes=int(growth), since_step=base_step, current_bytes=int(window[-1][1]),
            window_readings=len(window), window_steps=last_step - window[0][0], consistency=round(tau, 3),
            memory_kind=kind, shape=shape, steps_to_full=(free / slope if free is not None and free > 0 else None))
