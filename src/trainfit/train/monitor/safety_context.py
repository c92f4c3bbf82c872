"""What the safety policies of `trainfit train` share (trainfit.train.monitor.safety): the
SafetyContext (readings, clock, event log, risk state, the stop request), TrainingStopped, and the
helpers each policy reads the machine and the Trainer's state with."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.core.run.safety_thresholds import SafetyThresholds
from trainfit.errors import TrainfitError
from trainfit.hardware.sample_types import GpuSample, Sample
from trainfit.train.monitor.events import append_record, event

Log = Callable[[str], None]
SampleFn = Callable[[], Sample]
# (count of events seen) -> (the monitor's event records emitted since, count emitted): Monitor.events_since
EventsSince = Callable[[int], tuple[list[dict[str, Any]], int]]


class TrainingStopped(TrainfitError):
    """Training stopped on purpose after writing a checkpoint: by a signal (exit 128 + signal
    number) or by a safety limit (exit 4: the machine cannot train safely right now)."""

    def __init__(self, message: str, *, exit_code: int, hint: str | None = None, step: int | None = None,
                 kind: str = "") -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
        self.step = step
        self.kind = kind


@dataclass
class StopRequest:
    kind: str  # "signal", "thermal", "battery"
    exit_code: int
    message: str  # what happened, e.g. "SIGINT received"


@dataclass
class SafetyContext:
    """What the policies share: the readings, the clock, the event log, and the risk state."""

    thresholds: SafetyThresholds
    sample_fn: SampleFn | None = None
    log: Log = lambda message: None  # noqa: E731
    metrics_path: Path | None = None
    run_dir: Path | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    device: str | None = None  # cpu | cuda | rocm | mps; None: from TrainingArguments at train begin
    gpu_indices: tuple[int, ...] | None = None  # GPUs whose readings count (None: all in the reading)
    interactive: bool = False
    act: bool = True  # False: watch and log only (multi-process runs)
    # The run config's safety.interruption_hours (a spot machine's mean time between
    # interruptions, written by `trainfit plan --flavor ID --spot`); None: the mode's risk only.
    interruption_hours: float | None = None
    # shared state
    paused_seconds: float = 0.0  # total time spent in pauses (not training)
    on_battery: bool = False
    battery_seconds_left: float | None = None
    thermal_risk_until: float = -math.inf
    signal_received: int | None = None
    stop: StopRequest | None = None
    _read_failed: bool = False

    def read(self) -> Sample | None:
        """The sampler's reading now; None when there is no sampler or it failed (reported once: a
        failing sampler never stops training)."""
        if self.sample_fn is None:
            return None
        try:
            sample = self.sample_fn()
        except Exception as exc:  # noqa: BLE001
            if not self._read_failed:
                self._read_failed = True
                self.log(f"safety: machine readings failed ({type(exc).__name__}: {exc}); "
                         "thermal and battery policies are blind until they work again")
            return None
        self._read_failed = False
        return sample

    def emit(self, kind: str, step: int | None, reason: str, *, say: bool = True, **details: Any) -> dict[str, Any]:
        rec = event(kind, step, reason, **details)
        append_record(self.metrics_path, rec)
        if say:
            self.log(reason)
        return rec

    def risk(self, now: float) -> str:
        if self.on_battery:
            return "battery"
        if now < self.thermal_risk_until:
            return "thermal"
        return "normal"

    def request_stop(self, kind: str, exit_code: int, message: str) -> None:
        if self.stop is None:
            self.stop = StopRequest(kind, exit_code, message)

    def wait(self, ok: Callable[[Sample], bool], *, hold_seconds: float,
             max_seconds: float) -> tuple[str, Sample | None, float]:
        """Poll the readings every check_seconds until ok(reading) held for hold_seconds.
        Returns (outcome, last reading, seconds waited); outcome is "ok", "timeout" or "signal"."""
        start = self.clock()
        ok_since: float | None = None
        last: Sample | None = None
        outcome = "timeout"
        while True:
            if self.signal_received is not None:
                outcome = "signal"
                break
            waited = self.clock() - start
            if waited >= max_seconds:
                break
            self.sleep(max(0.0, min(self.thresholds.check_seconds, max_seconds - waited)))
            if self.signal_received is not None:
                outcome = "signal"
                break
            sample = self.read()
            now = self.clock()
            if sample is not None:
                last = sample
            if sample is not None and ok(sample):
                ok_since = now if ok_since is None else ok_since
                if now - ok_since >= hold_seconds:
                    outcome = "ok"
                    break
            else:
                ok_since = None
        waited = self.clock() - start
        self.paused_seconds += waited
        return outcome, last, waited

    def resume_command(self) -> str:
        out = f" --out {self.run_dir}" if self.run_dir is not None else ""
        return f"continue with: trainfit train RUN_CONFIG{out} --resume"


def vendor_device(args) -> str | None:
    """cpu | cuda | rocm | mps, from the Trainer's arguments."""
    dev = getattr(args, "device", None)
    kind = getattr(dev, "type", None) or (str(dev) if dev is not None else None)
    if kind == "cuda":
        import torch

        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return kind


def at_last_step(state) -> bool:
    return bool(state.max_steps) and state.global_step >= state.max_steps


def due_sample(policy, state):
    """(machine sample, now) when a policy's check interval has passed (not at the last step), else
    (None, now). Thermal and power policies read the machine at most every check_seconds."""
    now = policy.ctx.clock()
    if at_last_step(state) or now - policy.last_check < policy.ctx.thresholds.check_seconds:
        return None, now
    policy.last_check = now
    return policy.ctx.read(), now


def gpu_reading(g: GpuSample) -> dict[str, Any]:
    return {"index": g.index, "temperature_c": g.temperature_c, "slowdown_temperature_c": g.slowdown_temperature_c,
            "throttle_reasons": list(g.throttle_reasons), "power_watts": g.power_watts,
            "power_limit_watts": g.power_limit_watts, "sm_clock_mhz": g.sm_clock_mhz}
