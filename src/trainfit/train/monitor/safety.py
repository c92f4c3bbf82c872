"""Safety policies of `trainfit train` (seeds/001 §8): thermal protection, power management,
checkpoint frequency from the run-time estimate, and a clean stop on SIGINT / SIGTERM.

Each policy is a Transformers TrainerCallback that acts at optimizer-step boundaries through the
Trainer's own control flags (`should_save`, `should_training_stop`); nothing here runs a training
loop. Thresholds come from the run's safety mode (`safety.mode` in the run config; balanced when
absent), as data with their sources in trainfit.core.run.safety_thresholds.SAFETY.

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
  `cadence_interval`, core/run/checkpoint_cadence.py): checkpoint overhead <= 3 % of run time, never
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

Where they live: safety_context.py (SafetyContext, TrainingStopped), machine_policies.py
(thermal, power, memory pressure), run_policies.py (cadence, signals, StopAtTrainEnd,
NonFiniteGuard); this module builds a run's list of them.

Multi-process runs: control flags must be identical on every rank (a checkpoint is a collective
operation), so there only rank 0 watches and logs (thermal / battery events, no pauses, no extra
checkpoints) and signals are left to the launcher.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from transformers import TrainerCallback

from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.train.monitor.machine_policies import MemoryPressurePolicy, PowerPolicy, ThermalPolicy
from trainfit.train.monitor.run_policies import CadencePolicy, SignalPolicy, StopAtTrainEnd
from trainfit.train.monitor.safety_context import EventsSince, Log, SafetyContext, SampleFn


def safety_callbacks(mode: str | None, sample_fn: SampleFn | None, *, run_dir: str | os.PathLike | None,
                     interactive: bool = False, log: Log | None = None, device: str | None = None,
                     world_size: int | None = None, rank: int | None = None,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     handle_signals: bool = True, interruption_hours: float | None = None,
                     leak_events: EventsSince | None = None,
                     request_shrink: Callable[[str], bool] | None = None,
                     latest_checkpoint: Callable[[Path], str | None] | None = None,
                     **threshold_overrides) -> list[TrainerCallback]:
    """The safety callbacks of one run, to append after every other callback (the last one raises
    TrainingStopped at train end when a policy stopped the run).

    mode: the run config's safety.mode (None: balanced). sample_fn: () -> Sample, cheap and
    non-blocking (the monitor's latest reading; None: no thermal / battery policy). run_dir: its
    metrics.jsonl receives the events. device: cpu | cuda | rocm | mps (None: from the Trainer's
    arguments). clock / sleep: injectable for tests. interruption_hours: the run config's
    safety.interruption_hours (combined with the mode's risk by the cadence policy).
    leak_events: Monitor.events_since (its memory_leak findings count as pressure).
    request_shrink, latest_checkpoint: what recovery offers the policies (the runner passes
    trainfit.train.recovery.session.request_shrink and recovery.rollback.latest_checkpoint; the
    monitor package imports nothing of recovery): how memory pressure asks for a smaller step, and
    the newest complete checkpoint a stopped run names.
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
        out.append(MemoryPressurePolicy(ctx, request=request_shrink, leak_events=leak_events))
    if not ctx.act:
        return out
    signals = SignalPolicy(ctx) if handle_signals else None
    out += [p for p in (signals, CadencePolicy(ctx)) if p is not None]
    out.append(StopAtTrainEnd(ctx, signals, latest_checkpoint))
    return out


def context_of(callbacks: Iterable[TrainerCallback]) -> SafetyContext | None:
    """The shared SafetyContext of a safety_callbacks list (for tests and the runner's summary)."""
    for cb in callbacks:
        ctx = getattr(cb, "ctx", None)
        if isinstance(ctx, SafetyContext):
            return ctx
    return None
