"""Safety policies of `trainfit train` (seeds/001 §8): thermal protection, power management,
checkpoint frequency from the run-time estimate, and a clean stop on SIGINT / SIGTERM.

Each policy is a Transformers TrainerCallback that acts at optimizer-step boundaries through the
Trainer's own control flags (`should_save`, `should_training_stop`); nothing here runs a training
loop. Thresholds come from the run's safety mode (`safety.mode` in the run config; balanced when
absent), as data with their sources in trainfit.core.plan.modes.SAFETY.

* ThermalPolicy: a GPU reporting a heat throttle reason (sw_thermal / hw_thermal / hw_slowdown) or
  within the mode's margin of its slowdown threshold, or (CPU training) a CPU sensor over the
  mode's limit or throttle counters rising, pauses training: extreme mode checkpoints first. The
  pause polls the readings until the temperature stayed `hysteresis_c` below the pause threshold
  for `cool_hold_seconds`, then resumes (`thermal_pause` / `thermal_resume` events, with a
  power-cap suggestion). A pause longer than the mode's maximum checkpoints and stops (exit 4).
* PowerPolicy: on battery, CPU training keeps a share of its threads and checkpoints come more
  often (`power_battery`); below the mode's charge (or time-left) threshold it checkpoints and
  waits for AC (`battery_pause`, then `power_resume`), or stops after the mode's maximum wait.
* MemoryPressurePolicy: memory about to run out makes the run split its micro-batch (micro-batch
  down, accumulation up, the same global batch: trainfit.train.recovery) at the next optimizer
  step, before an out-of-memory error: free memory under the mode's headroom (RAM for CPU and
  Apple MPS, whose GPU shares it; each GPU's memory for CUDA / ROCm / XPU), swap growing by
  SWAP_GROWTH_BYTES during the run, or a memory leak (the monitor's `memory_leak` finding) that
  at its rate uses the free memory up before the run ends. Where the split cannot shrink any
  more, recovery steps the precision down instead (fp32 -> bf16 / fp16 mixed, where the device
  has it). After acting it waits PRESSURE_SETTLE_STEPS steps for the new split to show in the
  readings.
* CadencePolicy: saves when the work since the last checkpoint (of any origin) exceeds an
  interval chosen from the measured cost of one checkpoint, the risk and the ETA (see
  `cadence_interval`, core/checkpoint_cadence.py): checkpoint overhead <= 3 % of run time, never
  more than the mode's maximum loss of work. The risk is the mode's assumed time between
  interruptions, combined with the config's `safety.interruption_hours` (a spot machine's figure)
  when given; each decision event names the figure it used. The config's
  `checkpointing.every_steps` keeps its meaning: the Trainer still saves every N steps, so N is an
  upper bound on the interval in steps; the policy adds saves in between.
* SignalPolicy: the first SIGINT / SIGTERM finishes the current optimizer step, checkpoints and
  ends with exit code 130 / 143 (128 + the signal number, the shell's convention; the run is not
  finished, so a scheduler must not read it as a success); a second one aborts at once.
* StopAtTrainEnd (last): raises TrainingStopped after the Trainer's on_train_end, so the CLI
  prints one clear message with the resume command and exits with the policy's code.

Multi-process runs: control flags must be identical on every rank (a checkpoint is a collective
operation), so there only rank 0 watches and logs (thermal / battery events, no pauses, no extra
checkpoints) and signals are left to the launcher.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

# The cadence rule and the checkpoint-cost assumptions live in core (the planner and `cloud --spot`
# price the same interval the trainer uses).
from trainfit.core.checkpoint_cadence import (ASSUMED_CHECKPOINT_FIXED_SECONDS, ASSUMED_WRITE_BYTES_PER_SECOND,
                                              OPTIMIZER_BYTES_PER_TRAINABLE, cadence_interval,
                                              combined_interruption_seconds)
from trainfit.core.plan.hardware_rules import power_cap_hint
from trainfit.core.plan.modes import SafetyThresholds, safety_thresholds
from trainfit.errors import EXIT_UNAVAILABLE, TrainfitError
from trainfit.hardware.sample_types import GpuSample, Sample
from trainfit.train.events import append_record, event

Log = Callable[[str], None]
SampleFn = Callable[[], Sample]
# (count of events seen) -> (the monitor's event records emitted since, count emitted): Monitor.events_since
EventsSince = Callable[[int], tuple[list[dict[str, Any]], int]]

# NVML clock-event reasons that mean heat (hw_slowdown: heat, or an external power brake).
THERMAL_THROTTLE_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
# A power cap suggested after thermal trouble: 80 % of the current limit. Dynamic power grows with
# clock x voltage^2 and voltage with clock, so a 20 % lower cap costs much less than 20 % of the
# speed; it is a starting point to try, not a measured optimum.
SUGGESTED_CAP_SHARE = 0.8
EXIT_SIGNAL_BASE = 128  # exit code 128 + N for a stop by signal N (130 SIGINT, 143 SIGTERM)
MIB = 1 << 20
# Free memory each mode keeps, as a share of the device's memory: below it the split shrinks. The
# modes plan to use 50 / 75 / 95 % of memory (core/plan/modes.py); the margin is what is left
# for the allocator's fragmentation, other processes and the OS before an allocation fails
# (Linux starts reclaiming and swapping with a few percent free).
MEMORY_HEADROOM_SHARE = {"conservative": 0.15, "balanced": 0.10, "extreme": 0.05}
# Swap growth during the run that counts as pressure: beyond noise (the kernel swaps out idle
# pages of other programs by tens of MiB), well before the machine thrashes.
SWAP_GROWTH_BYTES = 256 * MIB
# After a shrink: optimizer steps before pressure is acted on again (the readings must show the
# new split first; the sampler reads once per monitoring interval).
PRESSURE_SETTLE_STEPS = 5
GPU_DEVICES = ("cuda", "rocm", "xpu")


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


def _vendor_device(args) -> str | None:
    """cpu | cuda | rocm | mps, from the Trainer's arguments."""
    dev = getattr(args, "device", None)
    kind = getattr(dev, "type", None) or (str(dev) if dev is not None else None)
    if kind == "cuda":
        import torch

        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return kind


def _last_step(state) -> bool:
    return bool(state.max_steps) and state.global_step >= state.max_steps


def _due_sample(policy, state):
    """(machine sample, now) when a policy's check interval has passed (not at the last step), else
    (None, now). Thermal and power policies read the machine at most every check_seconds."""
    now = policy.ctx.clock()
    if _last_step(state) or now - policy._last_check < policy.ctx.thresholds.check_seconds:
        return None, now
    policy._last_check = now
    return policy.ctx.read(), now


def _gpu_reading(g: GpuSample) -> dict[str, Any]:
    return {"index": g.index, "temperature_c": g.temperature_c, "slowdown_temperature_c": g.slowdown_temperature_c,
            "throttle_reasons": list(g.throttle_reasons), "power_watts": g.power_watts,
            "power_limit_watts": g.power_limit_watts, "sm_clock_mhz": g.sm_clock_mhz}


# ---------------------------------------------------------------------------------------------
# thermal
@dataclass(frozen=True)
class Trouble:
    """Why the device is too hot: one sentence, the readings, and the hint to avoid it."""

    what: str
    readings: dict[str, Any]
    hint: str
    resume_below_c: float | None  # the temperature to fall below (threshold - hysteresis)
    # What ends the pause, in words (a throttle-triggered pause ends on the throttle rate, not
    # on a temperature); None: "below resume_below_c".
    resume_when: str | None = None


class ThermalPolicy(TrainerCallback):
    def __init__(self, ctx: SafetyContext) -> None:
        self.ctx = ctx
        self._last_check = -math.inf
        self._throttle_prev: tuple[float, int] | None = None  # (clock, cumulative CPU throttle events)
        self._throttle_sample: Sample | None = None  # the reading the last rate came from
        self._throttle_last_rate: float | None = None
        self._pending: Trouble | None = None
        self._warned = False  # watch-only mode: one event per episode

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = _vendor_device(args)

    # -- the rules ---------------------------------------------------------------------------
    def _gpus(self, sample: Sample) -> list[GpuSample]:
        idx = self.ctx.gpu_indices
        return [g for g in sample.gpus if idx is None or g.index in idx]

    def _throttle_rate(self, sample: Sample, now: float) -> float | None:
        """CPU thermal-throttle events per minute since the previous reading. The same reading
        seen again (the monitor samples less often than a pause polls) keeps its rate: comparing
        it with itself would read as "no throttling"."""
        count = sample.host.cpu_throttle_events
        if count is None:
            return None
        if sample is self._throttle_sample:
            return self._throttle_last_rate
        self._throttle_sample = sample
        prev, self._throttle_prev = self._throttle_prev, (now, count)
        if prev is None or now <= prev[0]:
            self._throttle_last_rate = None
        else:
            self._throttle_last_rate = max(0, count - prev[1]) * 60.0 / (now - prev[0])
        return self._throttle_last_rate

    def assess(self, sample: Sample, now: float, *, cooling: bool = False) -> Trouble | None:
        """The thermal trouble in this reading, or None. cooling=True: the test that ends a pause
        (the temperature must be hysteresis_c below the pause threshold)."""
        th = self.ctx.thresholds
        below = th.hysteresis_c if cooling else 0.0
        device = self.ctx.device or "cuda"
        if device not in ("cpu", "mps"):
            for g in self._gpus(sample):
                reasons = [r for r in g.throttle_reasons if r in THERMAL_THROTTLE_REASONS]
                slowdown = g.slowdown_temperature_c or th.assumed_gpu_slowdown_c
                limit = slowdown - th.gpu_margin_c
                hot = g.temperature_c is not None and g.temperature_c >= limit - below
                if not (reasons or hot):
                    continue
                parts = []
                if g.temperature_c is not None:
                    src = "" if g.slowdown_temperature_c else " (assumed: the driver reports none)"
                    parts.append(f"GPU {g.index} at {g.temperature_c:.0f} C (it slows down at {slowdown:.0f} C{src}; "
                                 f"this mode pauses at {limit:.0f} C)")
                if reasons:
                    parts.append(f"GPU {g.index} throttling for heat ({', '.join(reasons)})")
                cap = int(g.power_limit_watts * SUGGESTED_CAP_SHARE) if g.power_limit_watts else None
                return Trouble("; ".join(parts), {"gpus": [_gpu_reading(g) for g in self._gpus(sample)]},
                               power_cap_hint(device, cap), limit - th.hysteresis_c)
        if device in ("cpu", "mps"):
            h = sample.host
            rate = self._throttle_rate(sample, now)
            hot = h.cpu_temperature_c is not None and h.cpu_temperature_c >= th.cpu_limit_c - below
            throttling = rate is not None and rate >= th.cpu_throttle_events_per_minute
            if hot or throttling:
                parts = []
                if hot:
                    parts.append(f"CPU at {h.cpu_temperature_c:.0f} C, over this mode's {th.cpu_limit_c:.0f} C limit")
                if throttling:
                    parts.append(f"CPU thermal throttling ({rate:.0f} events/min)")
                hint = (power_cap_hint("mps", None) if device == "mps"
                        else "train with fewer threads (OMP_NUM_THREADS) or improve the cooling")
                readings = {"cpu_temperature_c": h.cpu_temperature_c, "cpu_throttle_events": h.cpu_throttle_events,
                            "cpu_throttle_events_per_minute": rate, "cpu_package_watts": h.cpu_package_watts}
                resume = [f"the CPU is below {th.cpu_limit_c - th.hysteresis_c:.0f} C"] if hot else []
                if throttling:
                    resume.append(f"throttling is under {th.cpu_throttle_events_per_minute:g} events/min")
                return Trouble("; ".join(parts), readings, hint,
                               th.cpu_limit_c - th.hysteresis_c if hot else None, " and ".join(resume))
        return None

    # -- the callback ------------------------------------------------------------------------
    def on_step_end(self, args, state, control, **kw):
        ctx, th = self.ctx, self.ctx.thresholds
        sample, now = _due_sample(self, state)
        if sample is None:
            return
        trouble = self.assess(sample, now)
        if trouble is None:
            self._warned = False
            return
        ctx.thermal_risk_until = now + th.thermal_risk_seconds
        if not ctx.act:
            if not self._warned:
                self._warned = True
                ctx.emit("thermal_warning", state.global_step, f"thermal: {trouble.what}; to avoid it, {trouble.hint} "
                         "(not pausing: a multi-process run)", readings=trouble.readings)
            return
        if th.mode == "extreme":  # checkpoint first, pause once it is written (on_save)
            self._pending = trouble
            control.should_save = True
            return
        self._pause(trouble, state, control, checkpointed=False)

    def on_save(self, args, state, control, **kw):
        if self._pending is not None:
            trouble, self._pending = self._pending, None
            self._pause(trouble, state, control, checkpointed=True)

    def _pause(self, trouble: Trouble, state, control, *, checkpointed: bool) -> None:
        ctx, th = self.ctx, self.ctx.thresholds
        resume = trouble.resume_when or (f"it is below {trouble.resume_below_c:.0f} C" if
                                         trouble.resume_below_c is not None else "it is cool")
        ctx.emit("thermal_pause", state.global_step,
                 f"thermal pause at step {state.global_step}: {trouble.what}; "
                 + ("checkpoint written; " if checkpointed else "")
                 + f"waiting until {resume} for {th.cool_hold_seconds:g} s "
                 f"(at most {th.max_thermal_pause_seconds / 60:.0f} min). To avoid pauses, {trouble.hint} "
                 "(slower, cooler)",
                 readings=trouble.readings, checkpointed=checkpointed, resume_below_c=trouble.resume_below_c,
                 resume_when=resume, hint=trouble.hint, mode=th.mode)
        outcome, last, waited = ctx.wait(lambda s: self.assess(s, ctx.clock(), cooling=True) is None,
                                         hold_seconds=th.cool_hold_seconds, max_seconds=th.max_thermal_pause_seconds)
        readings = self._readings(last)
        if outcome == "ok":
            self._last_check = ctx.clock()
            ctx.thermal_risk_until = ctx.clock() + th.thermal_risk_seconds
            ctx.emit("thermal_resume", state.global_step,
                     f"thermal resume at step {state.global_step} after {waited:.0f} s: cooled down",
                     paused_seconds=waited, readings=readings)
        elif outcome == "timeout":
            ctx.emit("thermal_stop", state.global_step,
                     f"thermal: still hot after {waited / 60:.0f} min of pause; checkpointing and stopping",
                     paused_seconds=waited, readings=readings)
            ctx.request_stop("thermal", EXIT_UNAVAILABLE,
                             f"still too hot after {th.max_thermal_pause_seconds / 60:.0f} min of pause: "
                             f"{trouble.what}. Check the cooling, or {trouble.hint}")
            control.should_training_stop = True
            if not checkpointed:
                control.should_save = True
        # "signal": SignalPolicy (after this one) checkpoints and stops

    def _readings(self, sample: Sample | None) -> dict[str, Any] | None:
        if sample is None:
            return None
        if (self.ctx.device or "cuda") in ("cpu", "mps"):
            return {"cpu_temperature_c": sample.host.cpu_temperature_c,
                    "cpu_throttle_events": sample.host.cpu_throttle_events}
        return {"gpus": [_gpu_reading(g) for g in self._gpus(sample)]}


# ---------------------------------------------------------------------------------------------
# power
class PowerPolicy(TrainerCallback):
    def __init__(self, ctx: SafetyContext) -> None:
        self.ctx = ctx
        self._last_check = -math.inf
        self._threads: int | None = None  # torch threads before battery mode (CPU training)
        self._pending: dict[str, Any] | None = None

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = _vendor_device(args)

    def on_step_end(self, args, state, control, **kw):
        ctx = self.ctx
        sample, now = _due_sample(self, state)
        if sample is None:
            return
        h = sample.host
        if h.on_ac is False:
            ctx.battery_seconds_left = h.battery_seconds_left
            if not ctx.on_battery:
                ctx.on_battery = True
                self._on_battery(sample, state)
            low = self._low(h)
            if low and ctx.act:
                self._pending = {"battery_percent": h.battery_percent, "battery_seconds_left": h.battery_seconds_left,
                                 "why": low}
                control.should_save = True
        elif h.on_ac is True and ctx.on_battery:
            self._back_on_ac(state, waited=None)

    def _low(self, h) -> str | None:
        th = self.ctx.thresholds
        if h.battery_percent is not None and h.battery_percent <= th.battery_pause_percent:
            return f"battery at {h.battery_percent:.0f} %, at or below this mode's {th.battery_pause_percent:.0f} %"
        if h.battery_seconds_left is not None and h.battery_seconds_left <= th.battery_min_seconds_left:
            return (f"battery has {h.battery_seconds_left / 60:.0f} min left, under this mode's "
                    f"{th.battery_min_seconds_left / 60:.0f} min")
        return None

    def _on_battery(self, sample: Sample, state) -> None:
        ctx, th = self.ctx, self.ctx.thresholds
        h = sample.host
        details: dict[str, Any] = {"battery_percent": h.battery_percent, "battery_seconds_left": h.battery_seconds_left}
        what = []
        if ctx.device == "cpu" and ctx.act:
            import torch

            self._threads = torch.get_num_threads()
            fewer = max(1, int(self._threads * th.battery_thread_share))
            if fewer < self._threads:
                torch.set_num_threads(fewer)
                what.append(f"CPU threads {self._threads} -> {fewer}")
            details.update(threads_before=self._threads, threads_after=fewer)
        elif ctx.device not in (None, "cpu"):
            limits = [g.power_limit_watts for g in sample.gpus if g.power_limit_watts]
            cap = int(min(limits) * SUGGESTED_CAP_SHARE) if limits else None
            what.append(f"to draw less, {power_cap_hint(ctx.device, cap)}")
        if ctx.act:
            what.append("checkpoints more often")
        charge = f" ({h.battery_percent:.0f} %)" if h.battery_percent is not None else ""
        ctx.emit("power_battery", state.global_step,
                 f"on battery{charge} at step {state.global_step}: " + ", ".join(what or ["watching"])
                 + f"; below {th.battery_pause_percent:.0f} % training checkpoints and waits for AC",
                 **details)

    def _back_on_ac(self, state, waited: float | None) -> None:
        ctx = self.ctx
        ctx.on_battery = False
        ctx.battery_seconds_left = None
        restored = {}
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
            restored = {"threads": self._threads}
            self._threads = None
        after = f" after {waited / 60:.1f} min of pause" if waited is not None else ""
        ctx.emit("power_resume", state.global_step, f"on AC again at step {state.global_step}{after}: full speed",
                 paused_seconds=waited, **restored)

    def on_save(self, args, state, control, **kw):
        if self._pending is None:
            return
        ctx, th = self.ctx, self.ctx.thresholds
        low, self._pending = self._pending, None
        ctx.emit("battery_pause", state.global_step,
                 f"battery pause at step {state.global_step}: {low['why']}; checkpoint written, waiting for AC "
                 f"(at most {th.max_battery_wait_seconds / 60:.0f} min)",
                 battery_percent=low["battery_percent"], battery_seconds_left=low["battery_seconds_left"])
        outcome, last, waited = ctx.wait(lambda s: s.host.on_ac is True, hold_seconds=0.0,
                                         max_seconds=th.max_battery_wait_seconds)
        if outcome == "ok":
            self._last_check = ctx.clock()
            self._back_on_ac(state, waited)
        elif outcome == "timeout":
            pct = last.host.battery_percent if last is not None else None
            ctx.emit("battery_stop", state.global_step,
                     f"no AC after {waited / 60:.0f} min; stopping (checkpoint-{state.global_step} is written)",
                     paused_seconds=waited, battery_percent=pct)
            ctx.request_stop("battery", EXIT_UNAVAILABLE,
                             f"{low['why']}, and no AC within {th.max_battery_wait_seconds / 60:.0f} min of pause")
            control.should_training_stop = True


# ---------------------------------------------------------------------------------------------
# memory pressure
def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class MemoryPressurePolicy(TrainerCallback):
    """Shrinks the split before memory runs out (see the module doc). `request`: how a shrink is
    asked for (trainfit.train.recovery.session.request_shrink: at the next optimizer-step boundary, on
    every rank); `leak_events`: (count seen) -> (the monitor's event records emitted since, count
    emitted) (Monitor.events_since; its memory_leak findings)."""

    def __init__(self, ctx: SafetyContext, request: Callable[[str], bool] | None = None,
                 leak_events: EventsSince | None = None) -> None:
        self.ctx = ctx
        self.request = request or _request_shrink
        self.leak_events = leak_events
        self._last_check = -math.inf
        self._swap_base: int | None = None  # swap in use when the run started (or at the last shrink)
        self._quiet_until = -1  # no new request before this step (a shrink is taking effect)
        self._events_seen = 0  # the monitor's events read so far: each step reads only the new ones
        self.requests: list[tuple[int, str]] = []  # (step, reason) of each shrink asked for

    @property
    def margin(self) -> float:
        return MEMORY_HEADROOM_SHARE.get(self.ctx.thresholds.mode, MEMORY_HEADROOM_SHARE["balanced"])

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = _vendor_device(args)

    def on_step_end(self, args, state, control, **kw):
        leak = self._leak(state)  # every step: only the events emitted since the last one
        sample, _ = _due_sample(self, state)
        if state.global_step < self._quiet_until:
            return
        reason = leak or (self.pressure(sample) if sample is not None else None)
        if reason is None:
            return
        if self.request(reason):
            self.requests.append((state.global_step, reason))
            self._quiet_until = state.global_step + PRESSURE_SETTLE_STEPS
            if sample is not None and sample.host.swap_used_bytes is not None:
                self._swap_base = sample.host.swap_used_bytes
            self.ctx.log(f"memory pressure at step {state.global_step}: {reason}; asking for a smaller step at the "
                         "next boundary (the micro-batch split, or 16-bit activations at the smallest split)")

    def pressure(self, sample: Sample) -> str | None:
        """Why memory is about to run out in this reading, or None."""
        device = self.ctx.device or "cpu"
        mode = self.ctx.thresholds.mode
        h = sample.host
        if device in GPU_DEVICES:
            for g in sample.gpus:
                if self.ctx.gpu_indices is not None and g.index not in self.ctx.gpu_indices:
                    continue
                if g.memory_total_bytes and g.memory_used_bytes is not None:
                    free = g.memory_total_bytes - g.memory_used_bytes
                    if free < self.margin * g.memory_total_bytes:
                        return (f"GPU {g.index} memory {_gib(g.memory_used_bytes)} of {_gib(g.memory_total_bytes)} "
                                f"used, {free / g.memory_total_bytes:.1%} free (under {mode} mode's "
                                f"{self.margin:.0%} headroom)")
        elif h.ram_total_bytes and h.ram_used_bytes is not None:  # CPU, and Apple MPS (unified memory)
            free = h.ram_total_bytes - h.ram_used_bytes
            if free < self.margin * h.ram_total_bytes:
                return (f"RAM {_gib(h.ram_used_bytes)} of {_gib(h.ram_total_bytes)} used, "
                        f"{free / h.ram_total_bytes:.1%} free (under {mode} mode's {self.margin:.0%} headroom)")
        if h.swap_used_bytes is not None:
            if self._swap_base is None:
                self._swap_base = h.swap_used_bytes
            grown = h.swap_used_bytes - self._swap_base
            if grown >= SWAP_GROWTH_BYTES:
                return (f"swap in use grew by {_gib(grown)} during the run (now {_gib(h.swap_used_bytes)}): "
                        "the machine is paging memory out")
        return None

    def _leak(self, state) -> str | None:
        """A new memory_leak finding that runs the free memory out before the run ends."""
        if self.leak_events is None:
            return None
        try:
            records, self._events_seen = self.leak_events(self._events_seen)
        except Exception:  # noqa: BLE001  (the monitor's view; never stops training)
            return None
        for e in (r for r in records if r.get("event") == "memory_leak"):
            # judged at the step the finding was made: it reaches the policy a tick later, by when a
            # fast run has taken more steps (memory runs out at that step + steps_to_full)
            at = e.get("step") if isinstance(e.get("step"), int) else state.global_step
            left = (state.max_steps - at) if state.max_steps else None
            to_full = e.get("steps_to_full")
            if isinstance(to_full, (int, float)) and left is not None and to_full < left:
                return (f"a memory leak of {e.get('mib_per_step', 0):.3g} MiB per step uses the free memory up in "
                        f"about {to_full:,.0f} steps, before the run's end in {left} steps")
        return None


def _request_shrink(reason: str) -> bool:
    from trainfit.train.recovery.session import request_shrink

    return request_shrink(reason)


# ---------------------------------------------------------------------------------------------
# checkpoint cadence (the rule itself: core.checkpoint_cadence.cadence_interval)
def estimate_checkpoint_bytes(model) -> int:
    """What a checkpoint of `model` writes: the saved weights (a PEFT model saves its adapter only)
    plus AdamW's two fp32 moments per trainable parameter."""
    trainable = weights = 0
    peft = hasattr(model, "peft_config")
    for p in model.parameters():
        if p.requires_grad:
            trainable += p.numel()
        if p.requires_grad or not peft:
            weights += p.numel() * p.element_size()
    return int(weights + OPTIMIZER_BYTES_PER_TRAINABLE * trainable)


class CadencePolicy(TrainerCallback):
    def __init__(self, ctx: SafetyContext, *, write_bytes_per_second: float = ASSUMED_WRITE_BYTES_PER_SECOND) -> None:
        self.ctx = ctx
        self.write_bytes_per_second = write_bytes_per_second
        self.estimated_cost_seconds: float | None = None
        self.costs: list[float] = []  # measured seconds of each checkpoint
        self.decisions: list[dict[str, Any]] = []  # the logged cadence events
        self._steps: deque[float] = deque(maxlen=20)
        self._t0 = (0.0, 0.0)  # (clock, paused_seconds) at step begin
        self._stamp: tuple[float, float] | None = None  # (clock, paused_seconds) after the step's callbacks / log
        self._last_save = (0.0, 0.0)  # (clock, paused_seconds) at the last checkpoint (or train begin)
        self._logged: tuple[str, str, str, float] | None = None

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._last_save = (self.ctx.clock(), self.ctx.paused_seconds)
        if model is not None and self.estimated_cost_seconds is None:
            self.estimated_cost_seconds = (ASSUMED_CHECKPOINT_FIXED_SECONDS
                                           + estimate_checkpoint_bytes(model) / self.write_bytes_per_second)

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = (self.ctx.clock(), self.ctx.paused_seconds)

    def cost(self) -> tuple[float, str]:
        if self.costs:
            return statistics.median(self.costs[-5:]), "measured"
        if self.estimated_cost_seconds is None:  # no model given: the size-independent part
            return ASSUMED_CHECKPOINT_FIXED_SECONDS, "estimated"
        return self.estimated_cost_seconds, "estimated"

    def interruption_seconds(self, risk: str) -> float:
        """M for the cadence rule: the mode's assumed risk, combined with the run config's
        interruption figure when it has one (independent causes: their rates add), shortened
        on battery or after thermal trouble."""
        th = self.ctx.thresholds
        hours = self.ctx.interruption_hours
        m = combined_interruption_seconds(th.interruption_seconds, hours * 3600.0 if hours else None)
        m *= th.elevated_risk_share if risk != "normal" else 1.0
        if risk == "battery" and self.ctx.battery_seconds_left:
            m = min(m, self.ctx.battery_seconds_left)
        return m

    def interruption_source(self) -> str:
        """Which interruption figure the cadence uses, in words (logged with each decision)."""
        th = self.ctx.thresholds
        mode = f"{th.mode} mode's assumed {th.interruption_seconds / 3600:g} h"
        hours = self.ctx.interruption_hours
        if not hours:
            return mode
        return f"run config safety.interruption_hours {hours:g} h combined with the {mode}"

    def decide(self, state, now: float) -> dict[str, Any]:
        th = self.ctx.thresholds
        cost, source = self.cost()
        risk = self.ctx.risk(now)
        mtbf = self.interruption_seconds(risk)
        c = cadence_interval(cost, mtbf, th)
        step_s = statistics.fmean(self._steps) if self._steps else None
        eta = (state.max_steps - state.global_step) * step_s if step_s is not None and state.max_steps else None
        work = (now - self._last_save[0]) - (self.ctx.paused_seconds - self._last_save[1])
        save = work >= c.interval_seconds
        if save and eta is not None and eta < c.interval_seconds and work + eta <= th.max_loss_seconds:
            save = False  # the final checkpoint comes first and the loss bound holds without this one
        return {"interval_seconds": c.interval_seconds, "checkpoint_seconds": cost, "cost_source": source,
                "overhead_share": c.overhead_share, "limited_by": c.limited_by, "risk": risk,
                "interruption_seconds": mtbf, "interruption_source": self.interruption_source(),
                "config_interruption_hours": self.ctx.interruption_hours,
                "max_loss_seconds": th.max_loss_seconds, "eta_seconds": eta, "work_seconds": work, "save": save}

    def on_step_end(self, args, state, control, **kw):
        ctx = self.ctx
        now = ctx.clock()
        self._steps.append((now - self._t0[0]) - (ctx.paused_seconds - self._t0[1]))  # pauses are not steps
        d = self.decide(state, now)
        self._log_decision(d, state)
        if d["save"] and ctx.act:
            control.should_save = True
        self._stamp = (ctx.clock(), ctx.paused_seconds)

    def on_log(self, args, state, control, **kw):
        self._stamp = (self.ctx.clock(), self.ctx.paused_seconds)

    def on_save(self, args, state, control, **kw):
        now = self.ctx.clock()
        if self._stamp is not None:
            self.costs.append(max(0.0, (now - self._stamp[0]) - (self.ctx.paused_seconds - self._stamp[1])))
            self._stamp = None
        self._last_save = (now, self.ctx.paused_seconds)

    def _log_decision(self, d: dict[str, Any], state) -> None:
        key = (d["cost_source"], d["risk"], d["limited_by"], d["interval_seconds"])
        if self._logged is not None and key[:3] == self._logged[:3] and \
                abs(key[3] - self._logged[3]) <= 0.25 * self._logged[3]:
            return  # same decision (within 25 %)
        self._logged = key
        th = self.ctx.thresholds
        risk_of = f"{d['interruption_seconds'] / 3600:.3g} h between interruptions ({d['interruption_source']})"
        why = {"young": f"the optimum for a {d['checkpoint_seconds']:.2g} s checkpoint and {risk_of}",
               "overhead": f"so that checkpoints cost at most {th.overhead_max_share:.0%} of the run",
               "max_loss": "this mode's maximum loss of work"}[d["limited_by"]]
        over = "" if d["overhead_share"] <= th.overhead_max_share + 1e-9 else \
            f"; overhead {d['overhead_share']:.1%}, above the {th.overhead_max_share:.0%} target (the loss bound wins)"
        risk = "" if d["risk"] == "normal" else f", more often: {d['risk']}"
        details = {k: v for k, v in d.items() if k not in ("save", "work_seconds")}
        self.decisions.append(self.ctx.emit(
            "checkpoint_cadence", state.global_step,
            f"checkpoint every {_duration(d['interval_seconds'])} of training ({why}{risk}; "
            f"{d['cost_source']} {d['checkpoint_seconds']:.2g} s each){over}",
            say=d["cost_source"] == "measured" or d["risk"] != "normal", **details))


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2g} s"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------------------------
# signals
class SignalPolicy(TrainerCallback):
    """First SIGINT / SIGTERM: finish this optimizer step, checkpoint, stop (exit 128 + signal).
    Second one: abort at once (KeyboardInterrupt for SIGINT, SystemExit(143) for SIGTERM). The
    handlers are installed at train begin (main thread only) and the previous ones restored at
    train end or on the second signal."""

    def __init__(self, ctx: SafetyContext, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.ctx = ctx
        self.signals = tuple(signals)
        self._previous: dict[int, Any] = {}
        self._logged = False

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.ctx.signal_received is not None:
            self.restore()
            os.write(2, f"\ntrainfit: second {name}: aborting now, without a checkpoint\n".encode())
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(EXIT_SIGNAL_BASE + signum)
        self.ctx.signal_received = signum
        again = "Ctrl-C again" if self.ctx.interactive and signum == signal.SIGINT else f"a second {name}"
        # os.write, not print: a handler may run in the middle of another print
        os.write(2, f"\ntrainfit: {name}: finishing this step, then a checkpoint and exit "
                    f"({again} aborts without one)\n".encode())

    def on_train_begin(self, args, state, control, **kw):
        self.install()

    def _stop(self, state, control) -> None:
        signum = self.ctx.signal_received
        name = signal.Signals(signum).name
        control.should_training_stop = True
        self.ctx.request_stop("signal", EXIT_SIGNAL_BASE + signum, f"{name} received")
        if not self._logged:
            self._logged = True
            self.ctx.emit("signal", state.global_step, f"{name} at step {state.global_step}: checkpoint, then stop",
                          signal=name, exit_code=EXIT_SIGNAL_BASE + signum)

    def on_step_end(self, args, state, control, **kw):
        if self.ctx.signal_received is not None:
            control.should_save = True
            self._stop(state, control)

    def on_save(self, args, state, control, **kw):
        if self.ctx.signal_received is not None:  # arrived during the save or a pause after it
            self._stop(state, control)

    def on_train_end(self, args, state, control, **kw):
        self.restore()


class StopAtTrainEnd(TrainerCallback):
    """Last of the safety callbacks: when a policy stopped the run, raise TrainingStopped once the
    Trainer has ended (so the callbacks before this one, e.g. the progress bar, closed cleanly)."""

    def __init__(self, ctx: SafetyContext, signals: SignalPolicy | None = None) -> None:
        self.ctx = ctx
        self.signals = signals

    def on_train_end(self, args, state, control, **kw):
        if self.signals is not None:
            self.signals.restore()
        stop = self.ctx.stop
        if stop is None:
            return
        if stop.kind == "signal" and _last_step(state):
            self.ctx.log(f"{stop.message} at the last step: the run is complete")  # nothing to resume
            return
        raise TrainingStopped(f"stopped at step {state.global_step} of {state.max_steps}: {stop.message}; "
                              f"{self._newest_checkpoint(state.global_step)}",
                              exit_code=stop.exit_code, hint=self.ctx.resume_command(), step=state.global_step,
                              kind=stop.kind)

    def _newest_checkpoint(self, step: int) -> str:
        """Where the run continues from: normally the checkpoint of this step, just written."""
        if self.ctx.run_dir is None:
            return f"checkpoint-{step} is written"
        from trainfit.train.recovery import checkpoints as ck

        ckpt_dir = Path(self.ctx.run_dir) / "checkpoints"
        infos, _ = ck.scan(ckpt_dir, verify_hashes=False)  # sizes: the hashes were checked when written
        complete = [i for i in infos if i.complete]
        if not complete:
            return "no checkpoint was written: --resume would start from step 0"
        newest = complete[-1]
        return (f"{newest.path} is written" if newest.step == step
                else f"the newest checkpoint is {newest.path} (step {newest.step})")


# ---------------------------------------------------------------------------------------------
def safety_callbacks(mode: str | None, sample_fn: SampleFn | None, *, run_dir: str | os.PathLike | None,
                     interactive: bool = False, log: Log | None = None, device: str | None = None,
                     world_size: int | None = None, rank: int | None = None,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     handle_signals: bool = True, interruption_hours: float | None = None,
                     leak_events: EventsSince | None = None,
                     **threshold_overrides) -> list[TrainerCallback]:
    """The safety callbacks of one run, to append after every other callback (the last one raises
    TrainingStopped at train end when a policy stopped the run).

    mode: the run config's safety.mode (None: balanced). sample_fn: () -> Sample, cheap and
    non-blocking (the monitor's latest reading; None: no thermal / battery policy). run_dir: its
    metrics.jsonl receives the events. device: cpu | cuda | rocm | mps (None: from the Trainer's
    arguments). clock / sleep: injectable for tests. interruption_hours: the run config's
    safety.interruption_hours (combined with the mode's risk by the cadence policy).
    leak_events: Monitor.events_since (its memory_leak findings count as pressure).
    threshold_overrides: SafetyThresholds fields.
    """
    env_rank, env_world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if rank != 0:
        return []
    run_dir = Path(run_dir) if run_dir is not None else None
    if device == "cuda" and getattr(getattr(sys.modules.get("torch"), "version", None), "hip", None):
        device = "rocm"  # torch says cuda on ROCm too; the power-cap hint names the vendor's tool
    ctx = SafetyContext(thresholds=safety_thresholds(mode, **threshold_overrides), sample_fn=sample_fn,
                        log=log or (lambda m: None), metrics_path=run_dir / "metrics.jsonl" if run_dir else None,
                        run_dir=run_dir, clock=clock, sleep=sleep, device=device, interactive=interactive,
                        act=world_size == 1, interruption_hours=interruption_hours)
    out: list[TrainerCallback] = []
    if sample_fn is not None:
        out += [ThermalPolicy(ctx), PowerPolicy(ctx)]
    if sample_fn is not None or leak_events is not None:
        # a shrink is agreed by every rank at the next step boundary (recovery), so rank 0 acts
        # for all of them, multi-process runs included
        out.append(MemoryPressurePolicy(ctx, leak_events=leak_events))
    if not ctx.act:
        return out
    signals = SignalPolicy(ctx) if handle_signals else None
    out += [p for p in (signals, CadencePolicy(ctx)) if p is not None]
    out.append(StopAtTrainEnd(ctx, signals))
    return out


class NonFiniteGuard(TrainerCallback):
    """For any Transformers Trainer (outside `trainfit train`, whose recovery does more): an
    optimizer step whose gradients are NaN or inf is skipped (its gradients dropped before the
    update, as a GradScaler does for an fp16 overflow); a step that would checkpoint weights that
    are not finite does not checkpoint; `max_streak` such steps in a row stop the training
    (control.should_training_stop), since the run has diverged and a lower learning rate, more
    warm-up or a check of the data is needed. `log` receives one line per event.

        trainer = Trainer(..., callbacks=[MonitorCallback(metrics_path=...), NonFiniteGuard()])
    """

    def __init__(self, max_streak: int = 3, log: Log | None = None) -> None:
        self.max_streak = max_streak
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.streak = 0
        self.skipped: list[int] = []  # optimizer steps (from 1) whose update was skipped

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        import torch

        if model is None:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        bad = bool(grads) and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        if not bad:
            self.streak = 0
            return
        self.streak += 1
        self.skipped.append(state.global_step + 1)
        model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
        self.log(f"step {state.global_step + 1}: gradients are not finite; update skipped ({self.streak} in a row)")
        if self.streak >= self.max_streak:
            control.should_training_stop = True
            self.log(f"stopping: {self.streak} optimizer steps in a row had non-finite gradients (the run diverged; "
                     "lower the learning rate, raise the warm-up or check the data)")

    def on_step_end(self, args, state, control, model=None, **kw):
        import torch

        if control.should_save and model is not None and not all(
                bool(torch.isfinite(p.detach()).all()) for p in model.parameters() if p.requires_grad):
            control.should_save = False
            self.log(f"step {state.global_step}: weights are not finite; not checkpointing this state")


def context_of(callbacks: Iterable[TrainerCallback]) -> SafetyContext | None:
    """The shared SafetyContext of a safety_callbacks list (for tests and the runner's summary)."""
    for cb in callbacks:
        ctx = getattr(cb, "ctx", None)
        if isinstance(ctx, SafetyContext):
            return ctx
    return None
