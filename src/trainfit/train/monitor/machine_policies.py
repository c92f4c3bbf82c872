"""The safety policies that watch the machine (trainfit.train.monitor.safety): ThermalPolicy,
PowerPolicy, MemoryPressurePolicy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from trainfit.core.plan.hardware_rules import power_cap_hint
from trainfit.errors import EXIT_UNAVAILABLE
from trainfit.hardware.sample_types import GpuSample, Sample
from trainfit.train.monitor.safety_context import EventsSince, SafetyContext, due_sample, gpu_reading, vendor_device

# NVML clock-event reasons that mean heat (hw_slowdown: heat, or an external power brake).
THERMAL_THROTTLE_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
# A power cap suggested after thermal trouble: 80 % of the current limit. Dynamic power grows with
# clock x voltage^2 and voltage with clock, so a 20 % lower cap costs much less than 20 % of the
# speed; it is a starting point to try, not a measured optimum.
SUGGESTED_CAP_SHARE = 0.8
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
        self.last_check = -math.inf
        self._throttle_prev: tuple[float, int] | None = None  # (clock, cumulative CPU throttle events)
        self._throttle_sample: Sample | None = None  # the reading the last rate came from
        self._throttle_last_rate: float | None = None
        self._pending: Trouble | None = None
        self._warned = False  # watch-only mode: one event per episode

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = vendor_device(args)

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
                return Trouble("; ".join(parts), {"gpus": [gpu_reading(g) for g in self._gpus(sample)]},
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
        sample, now = due_sample(self, state)
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
            self.last_check = ctx.clock()
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
        return {"gpus": [gpu_reading(g) for g in self._gpus(sample)]}


class PowerPolicy(TrainerCallback):
    def __init__(self, ctx: SafetyContext) -> None:
        self.ctx = ctx
        self.last_check = -math.inf
        self._threads: int | None = None  # torch threads before battery mode (CPU training)
        self._pending: dict[str, Any] | None = None

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = vendor_device(args)

    def on_step_end(self, args, state, control, **kw):
        ctx = self.ctx
        sample, now = due_sample(self, state)
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
            self.last_check = ctx.clock()
            self._back_on_ac(state, waited)
        elif outcome == "timeout":
            pct = last.host.battery_percent if last is not None else None
            ctx.emit("battery_stop", state.global_step,
                     f"no AC after {waited / 60:.0f} min; stopping (checkpoint-{state.global_step} is written)",
                     paused_seconds=waited, battery_percent=pct)
            ctx.request_stop("battery", EXIT_UNAVAILABLE,
                             f"{low['why']}, and no AC within {th.max_battery_wait_seconds / 60:.0f} min of pause")
            control.should_training_stop = True


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class MemoryPressurePolicy(TrainerCallback):
    """Shrinks the split before memory runs out (see the module doc). `request`: how a shrink is
    asked for (`trainfit train` passes trainfit.train.recovery.session.request_shrink: at the next
    optimizer-step boundary, on every rank; None: no training to ask, nothing is asked); `leak_events`: (count seen) -> (the monitor's event records emitted since, count
    emitted) (Monitor.events_since; its memory_leak findings)."""

    def __init__(self, ctx: SafetyContext, request: Callable[[str], bool] | None = None,
                 leak_events: EventsSince | None = None) -> None:
        self.ctx = ctx
        self.request = request or _nothing_to_ask
        self.leak_events = leak_events
        self.last_check = -math.inf
        self._swap_base: int | None = None  # swap in use when the run started (or at the last shrink)
        self._quiet_until = -1  # no new request before this step (a shrink is taking effect)
        self._events_seen = 0  # the monitor's events read so far: each step reads only the new ones
        self.requests: list[tuple[int, str]] = []  # (step, reason) of each shrink asked for

    @property
    def margin(self) -> float:
        return MEMORY_HEADROOM_SHARE.get(self.ctx.thresholds.mode, MEMORY_HEADROOM_SHARE["balanced"])

    def on_train_begin(self, args, state, control, **kw):
        if self.ctx.device is None:
            self.ctx.device = vendor_device(args)

    def on_step_end(self, args, state, control, **kw):
        leak = self._leak(state)  # every step: only the events emitted since the last one
        sample, _ = due_sample(self, state)
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


def _nothing_to_ask(reason: str) -> bool:
    """No training to ask for a smaller step (the policy runs outside `trainfit train`)."""
    return False
