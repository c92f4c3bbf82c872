"""Fakes for the sampler and the monitor: fixture machines read through the live code path, and
time series of Samples.

* `fixture_sources(path_or_data, ...)`: the Sources of a fixture machine (hardware/fakes.py) with
  what the sampler reads on top of the profiler: psutil's `cpu_percent` and `Process().memory_info()`
  and NVML's utilisation. `Sampler(fixture_sources(...))` runs the real sampling code against the
  fixture's fake NVML, psutil and sysfs. The fixture's answers stay mutable (`src.psutil.data`,
  `src.nvml_data["devices"][i]`), and a file given as a list of texts answers them in turn, so a
  test can move a reading between two samples.
* `FakeSampler`: Samples from a list, or from per-field values, lists (one entry per sample,
  the last repeats) or functions of the time since the first sample, e.g.
  `FakeSampler(host={"battery_percent": ramp((0, 80), (600, 15)), "on_ac": step_at(60, True, False)},
  gpus=[{"temperature_c": ramp((0, 60), (30, 95), (60, 70))}])`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trainfit.hardware.fakes import FakeNvml, FakeNvmlError, FakePsutil, load_fixture_data, sources_from_data
from trainfit.hardware.sample_types import GpuSample, HostSample, Sample
from trainfit.hardware.sources import Sources

NOT_SIMULATED = "not simulated by this FakeSampler"


class SamplingPsutil(FakePsutil):
    """FakePsutil plus the calls the sampler makes every sample. Fixture keys (psutil: ...):
    `cpu_percent` (a number or a list answered in turn) and `process_rss` (bytes, or a list);
    without them the call raises, as psutil does where it cannot read."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data)
        self._turns: dict[str, int] = {}

    def _next(self, key: str) -> Any:
        if key not in self.data:
            raise RuntimeError(f"{key} is not recorded in this fixture")
        value = self.data[key]
        if isinstance(value, list):
            n = self._turns.get(key, 0)
            self._turns[key] = n + 1
            return value[min(n, len(value) - 1)]
        return value

    def cpu_percent(self, interval: float | None = None) -> float:
        return float(self._next("cpu_percent"))

    def Process(self, pid: int | None = None) -> Any:  # noqa: N802 (psutil's name)
        return SimpleNamespace(memory_info=lambda: SimpleNamespace(rss=int(self._next("process_rss"))))


class SamplingNvml(FakeNvml):
    """FakeNvml plus utilisation (device key `utilization: {gpu: 97, memory: 40}`; absent = not
    supported) and a call counter (to prove NVML is initialised once)."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data)
        self.init_calls = self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        super().nvmlInit()

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self._field(h, "utilization", h.get("utilization"))
        return SimpleNamespace(gpu=u["gpu"], memory=u.get("memory", 0))


def fixture_sources(fixture: str | Path | dict[str, Any], *, cpu_percent: Any = None, process_rss: Any = None,
                    torch: Any = None) -> Sources:
    """Sources of a fixture machine for the sampler. `cpu_percent` / `process_rss` (a value or a
    list answered in turn) are added to the fixture's psutil answers; `torch` stands for an
    imported torch module (None: torch not imported). `src.nvml_module` is the one fake NVML
    (created on first use), `src.nvml_data` its data."""
    data = load_fixture_data(fixture) if isinstance(fixture, (str, Path)) else fixture
    src = sources_from_data(data)
    ps_data = dict(data["psutil"])
    if cpu_percent is not None:
        ps_data["cpu_percent"] = cpu_percent
    if process_rss is not None:
        ps_data["process_rss"] = process_rss
    src.psutil = SamplingPsutil(ps_data)
    nvml_data = data.get("nvml")
    holder: dict[str, SamplingNvml] = {}

    def nvml() -> SamplingNvml:
        if nvml_data is None:
            raise ImportError("libnvidia-ml is not installed on this fixture machine")
        if "module" not in holder:
            holder["module"] = SamplingNvml(nvml_data)
        return holder["module"]

    src.nvml = nvml
    src.torch = lambda: torch
    src.nvml_data = nvml_data  # type: ignore[attr-defined]
    src.nvml_module = holder  # type: ignore[attr-defined]
    return src


# ---- time series ---------------------------------------------------------------------------

def ramp(*points: tuple[float, float]) -> Callable[[float], float]:
    """Piecewise-linear value through (t, value) points; flat before the first and after the last."""
    pts = sorted(points)
    if not pts:
        raise ValueError("ramp needs at least one (t, value) point")

    def value(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
            if t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
        return pts[-1][1]

    return value


def step_at(t_switch: float, before: Any, after: Any) -> Callable[[float], Any]:
    """`before` until t_switch seconds, `after` from then on (e.g. AC unplugged at t)."""
    return lambda t: before if t < t_switch else after


class ManualClock:
    """A clock that moves only when told: `clock()` reads it, `clock.advance(s)` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Series = Any  # a value, a sequence (one per sample, the last repeats) or a function of t


def _at(series: Series, t: float, n: int) -> Any:
    if callable(series):
        return series(t)
    if isinstance(series, list):  # one entry per sample (a tuple is a value, e.g. throttle reasons)
        return series[min(n, len(series) - 1)] if series else None
    return series


class FakeSampler:
    """A sampler answering from a script (the Monitor takes it instead of a Sampler).

    `samples`: Samples returned in turn (the last repeats), re-stamped with the wall clock unless
    `keep_times`. Or `host` / `gpus`: field -> a value (a tuple is a value), a list (one entry
    per sample, the last repeats) or a function of t (seconds since the first sample() on
    `clock`, time.monotonic by default); fields not given are None with the reason NOT_SIMULATED.
    `delay_seconds` makes each sample() take that long (a slow driver);
    `fail_at` makes the listed sample numbers raise (a sampler bug)."""

    def __init__(self, samples: Sequence[Sample] | None = None, *, host: dict[str, Series] | None = None,
                 gpus: Sequence[dict[str, Series]] | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, keep_times: bool = False, delay_seconds: float = 0.0,
                 fail_at: Sequence[int] = ()) -> None:
        if samples is None and host is None and gpus is None:
            host = {}
        self._samples = list(samples) if samples is not None else None
        self._host = dict(host or {})
        self._gpus = [dict(g) for g in (gpus or [])]
        self._clock, self._wall, self._keep = clock, wall, keep_times
        self._t0: float | None = None
        self._delay = delay_seconds
        self._fail_at = set(fail_at)
        self.calls = 0
        self.closed = False
        self.threads: set[str] = set()  # names of the threads that called sample()

    def sample(self) -> Sample:
        n = self.calls
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self._delay:
            time.sleep(self._delay)
        if n in self._fail_at:
            raise RuntimeError(f"scripted sampler failure at sample {n}")
        if self._samples is not None:
            s = self._samples[min(n, len(self._samples) - 1)]
            return s if self._keep else dataclasses.replace(s, time=self._wall())
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        t = now - self._t0
        host = _build(HostSample, self._host, t, n)
        gpus = tuple(_build(GpuSample, {"index": i, **g}, t, n) for i, g in enumerate(self._gpus))
        return Sample(time=self._wall(), host=host, gpus=gpus)

    def close(self) -> None:
        self.closed = True


def _build(cls: type, spec: dict[str, Series], t: float, n: int) -> Any:
    values: dict[str, Any] = {}
    why: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.name == "unavailable":
            continue
        if f.name in spec:
            value = _at(spec[f.name], t, n)
            if f.name == "throttle_reasons":
                value = (value,) if isinstance(value, str) else tuple(value or ())
            values[f.name] = value
        if values.get(f.name) is None and f.name != "throttle_reasons":
            why[f.name] = NOT_SIMULATED if f.name not in spec else "scripted as unknown"
    extra = set(spec) - {f.name for f in dataclasses.fields(cls)}
    if extra:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(sorted(extra))}")
    return cls(**values, unavailable=why)


__all__ = ["FakeNvmlError", "FakeSampler", "MachineScript", "ManualClock", "StepClock", "SamplingNvml",
           "SamplingPsutil", "fixture_sources", "ramp", "step_at", "NOT_SIMULATED"]


# ---- a scripted machine for a whole `trainfit train` run -----------------------------------

class StepClock:
    """Series tied to the training's progress: `at(series)` evaluates a script series (see
    MachineScript) against the current optimizer step (`step_fn`) and the seconds since a step
    was first reached (`clock`). Shared by every sampler a run makes (a recovery restarts the
    monitor), so a trigger fires once per run."""

    def __init__(self, step_fn: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.step_fn = step_fn
        self.clock = clock
        self._reached: dict[int, float] = {}  # step -> clock when it was first seen
        self._lock = threading.Lock()

    def seconds_since(self, step: int) -> float | None:
        """Seconds since the training first reached `step` (None: not yet)."""
        now = self.clock()
        current = self.step_fn()
        with self._lock:
            if step not in self._reached and current >= step:
                self._reached[step] = now
            start = self._reached.get(step)
        return None if start is None else now - start

    def at(self, series: Any) -> Any:
        if not isinstance(series, dict):
            return series  # a plain value (a list is a list, e.g. throttle reasons)
        if "by_step" in series:  # piecewise linear in optimizer steps
            return _through(series["by_step"], self.step_fn())
        since = self.seconds_since(int(series.get("from_step", 0)))
        if since is None:
            return series.get("before")
        return _through(series["ramp"], since)


def _typed(name: str, value: Any) -> Any:
    """Byte and event counts are whole numbers (a ramp between two of them is not)."""
    if isinstance(value, float) and (name.endswith("_bytes") or name.endswith("_events")):
        return int(round(value))
    return value


def _through(points: list, x: float) -> Any:
    """Piecewise linear through numeric points; a series of true / false holds each value until
    the next point (a switch, e.g. AC plugged in again)."""
    pts = sorted((p[0], p[1]) for p in points)
    if any(isinstance(v, bool) for _, v in pts):
        return [v for t, v in pts if t <= x][-1] if x >= pts[0][0] else pts[0][1]
    return ramp(*pts)(x)


_SERIES_KEYS = {"by_step", "from_step", "before", "ramp"}
MACHINE_KEYS = {"interval_seconds", "safety", "leak_detector", "leak_read_seconds", "leak_check_seconds",
                "memory_reading", "host", "gpus"}


def check_machine_script(spec: Any, where: str) -> dict[str, Any]:
    """The script as a dict, or ValueError naming what is wrong (see MachineScript)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a machine script is a JSON object")
    unknown = set(spec) - MACHINE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                         f"(valid: {', '.join(sorted(MACHINE_KEYS))})")
    host_fields = {f.name for f in dataclasses.fields(HostSample)} - {"unavailable"}
    gpu_fields = {f.name for f in dataclasses.fields(GpuSample)} - {"unavailable"}
    parts = [("host", spec.get("host") or {}, host_fields)]
    parts += [(f"gpus[{i}]", g, gpu_fields) for i, g in enumerate(spec.get("gpus") or [])]
    for name, fields_, valid in parts:
        if not isinstance(fields_, dict):
            raise ValueError(f"{where}: {name} must be an object of field -> series")
        bad = set(fields_) - valid
        if bad:
            raise ValueError(f"{where}: {name} has no field(s) {', '.join(sorted(bad))}")
        for key, series in fields_.items():
            _check_series(series, f"{where}: {name}.{key}")
    if "memory_reading" in spec:
        _check_series(spec["memory_reading"], f"{where}: memory_reading")
    return spec


def _check_series(series: Any, where: str) -> None:
    if not isinstance(series, dict):
        return
    if set(series) - _SERIES_KEYS or not ({"by_step", "ramp"} & set(series)):
        raise ValueError(f"{where}: a series is a value, {{\"by_step\": [[step, value], ...]}} or "
                         "{\"from_step\": N, \"before\": value, \"ramp\": [[seconds, value], ...]}")
    points = series.get("by_step") or series.get("ramp")
    if not isinstance(points, list) or not points or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p) for p in points):
        raise ValueError(f"{where}: points must be a non-empty list of [x, value] pairs of numbers (or true / false "
                         "values)")


class MachineScript:
    """A scripted machine for `trainfit train` (TRAINFIT_FAKE_MACHINE, trainfit.train.recovery.faults):

        {"interval_seconds": 0.05,                 the monitor's sampling interval
         "safety": {"check_seconds": 0.05, ...},   SafetyThresholds fields for this run
         "leak_detector": {"warmup_steps": 2, ...}, "leak_read_seconds": 0, "leak_check_seconds": 0,
         "memory_reading": SERIES,                 bytes the leak detector reads at step ends
         "host": {FIELD: SERIES, ...}, "gpus": [{FIELD: SERIES, ...}, ...]}

    A SERIES is a value; {"by_step": [[step, value], ...]} (piecewise linear in optimizer steps);
    or {"from_step": N, "before": value, "ramp": [[seconds, value], ...]}: `before` until the
    training reaches step N, then piecewise linear in the seconds since (pauses included, so a
    device cools down while training waits). Points with true / false values switch (on_ac).
    Fields are HostSample / GpuSample fields; the ones not given are unknown, as on a machine that
    cannot read them."""

    def __init__(self, spec: dict[str, Any], step_fn: Callable[[], int], clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.steps = StepClock(step_fn, clock)

    def _fields(self, fields_: dict[str, Any]) -> dict[str, Callable[[float], Any]]:
        return {k: (lambda t, s=s, k=k: _typed(k, self.steps.at(s))) for k, s in fields_.items()}

    def sampler(self) -> FakeSampler:
        """A fresh sampler (the monitor makes one per training attempt) over the shared series."""
        return FakeSampler(host=self._fields(self.spec.get("host") or {}),
                           gpus=[self._fields(g) for g in self.spec.get("gpus") or []])

    def memory_reading(self) -> tuple[int | None, str] | None:
        """(bytes, kind) for the leak detector, or None when the script has no memory_reading."""
        if "memory_reading" not in self.spec:
            return None
        value = self.steps.at(self.spec["memory_reading"])
        return (int(round(value)) if value is not None else None), "process_rss"

    @property
    def safety_overrides(self) -> dict[str, Any]:
        return dict(self.spec.get("safety") or {})
