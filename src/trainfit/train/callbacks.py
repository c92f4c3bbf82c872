"""TrainerCallbacks: metrics.jsonl, step timing, memory, progress bar / log lines, stop-at-step.

Only the main process writes or prints; every process times its own steps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trainfit.train.monitor.events import append_record
from trainfit.train.monitor.live import eta_seconds, peak_rss_bytes


def device_memory() -> dict[str, int]:
    """Peak memory on the training device: CUDA allocator statistics, else the process RSS."""
    import torch

    out = {"peak_rss_bytes": peak_rss_bytes()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        out["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    return out


class StepTimer(TrainerCallback):
    """Wall seconds of every optimizer step (forward + backward of all micro-batches + update)."""

    def __init__(self) -> None:
        self.step_seconds: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.step_seconds.append(time.perf_counter() - self._t0)


class StopAt(TrainerCallback):
    """Stop (and checkpoint) after `stop_step` optimizer steps, keeping the configured schedule,
    so that a later --resume continues the very same run. Also checkpoints the final step."""

    def __init__(self, stop_step: int | None) -> None:
        self.stop_step = stop_step

    def on_step_end(self, args, state, control, **kw):
        if self.stop_step is not None and state.global_step >= self.stop_step:
            control.should_training_stop = True
            control.should_save = True
        if state.max_steps and state.global_step >= state.max_steps:
            control.should_save = True


class MetricsWriter(TrainerCallback):
    """Appends one JSON line per logging step to metrics.jsonl (main process only)."""

    def __init__(self, path: Path | None, tokens_fn, timer: StepTimer, world_size: int,
                 stop_step: int | None = None) -> None:
        self.path = path
        self.stop_step = stop_step  # where this invocation stops (--max-steps), for the ETA
        self.tokens_fn = tokens_fn  # () -> tokens processed on this rank so far
        self.timer = timer
        self.world = world_size
        self.records: list[dict[str, Any]] = []
        self._last_t = self._last_tokens = 0.0
        self._last_step = 0
        self._start = 0.0

    def eta_seconds(self, state) -> float | None:
        # steps left to where this invocation ends (pauses are not steps; None before a step was timed)
        end = end_step(state, self.stop_step)
        return eta_seconds(end - state.global_step if end else None, self.timer.step_seconds)

    def on_train_begin(self, args, state, control, **kw):
        self._start = self._last_t = time.perf_counter()
        self._last_tokens = self.tokens_fn()
        self._last_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        now, tokens = time.perf_counter(), self.tokens_fn()
        dt = max(now - self._last_t, 1e-9)
        steps = max(state.global_step - self._last_step, 1)
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.world
        rec = {
            "step": state.global_step,
            "loss": float(logs["loss"]),
            "learning_rate": float(logs.get("learning_rate", 0.0)),
            "grad_norm": float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
            "tokens_per_second": (tokens - self._last_tokens) * self.world / dt,
            "samples_per_second": steps * batch / dt,
            "step_seconds": self.timer.step_seconds[-1] if self.timer.step_seconds else None,
            "elapsed_seconds": now - self._start,
            "eta_seconds": self.eta_seconds(state),
            "time": time.time(),
            **device_memory(),
        }
        for k in ("rewards/accuracies", "rewards/margins"):
            if k in logs:
                rec[k.replace("/", "_")] = float(logs[k])
        self._last_t, self._last_tokens, self._last_step = now, tokens, state.global_step
        self.records.append(rec)
        append_record(self.path, rec)


class RunPlan(TrainerCallback):
    """Writes what an attempt is planned to do as it begins (a `run_plan` event: the steps of
    the schedule, where this invocation stops, the memory model's predicted peak and step time,
    the split and precision), so a run killed before summary.json can still be compared with its
    plan by `trainfit report`. `details` is set by the runner once the model is built."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.details: dict[str, Any] = {}
        self._written = False

    def on_train_begin(self, args, state, control, **kw):
        self._written = False  # once per attempt

    def on_step_begin(self, args, state, control, **kw):
        # at the first step (after BeforeFirstStep trimmed a resumed run's metrics): a start that
        # fails while loading its checkpoint writes nothing
        if self._written or self.path is None or not state.is_world_process_zero:
            return
        self._written = True
        from trainfit.train.monitor.events import event

        d = {**self.details, "max_steps": state.max_steps}
        pred = d.get("predicted") or {}
        planned = (state.max_steps * pred["step_seconds"] if state.max_steps and pred.get("step_seconds")
                   else None)
        peak = pred.get("total_bytes")
        reason = (f"planned: {state.max_steps} steps" + (f" (~{planned / 60:.1f} min predicted)" if planned else "")
                  + (f", peak memory {peak / (1 << 30):.2f} GiB predicted" if peak else ", no memory prediction")
                  + (f", stopping at step {d['stop_step']}" if d.get("stop_step") else ""))
        append_record(self.path, event("run_plan", state.global_step, reason, planned_seconds=planned, **d))


def end_step(state, stop_step: int | None) -> int:
    """The step an invocation ends at: the schedule's last, or --max-steps when that comes first."""
    if stop_step is not None and (not state.max_steps or stop_step < state.max_steps):
        return stop_step
    return state.max_steps


class BeforeFirstStep(TrainerCallback):
    """Calls `fn` once, when the first optimizer step of this invocation begins: by then a resumed
    checkpoint is fully loaded (weights, optimizer, scheduler, RNG state), so a resume that fails
    while loading has not changed anything yet."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def on_step_begin(self, args, state, control, **kw):
        if self.fn is not None:
            fn, self.fn = self.fn, None
            fn()


class Progress(TrainerCallback):
    """A rich progress bar with ETA on stderr, or plain log lines (--quiet / not a terminal).

    Both count to where this invocation stops: the schedule's last step, or --max-steps when that
    comes first (the bar's total and its ETA are for the steps this invocation runs)."""

    def __init__(self, mode: str, label: str, writer: MetricsWriter, stop_step: int | None = None) -> None:
        self.mode = mode  # "bar" or "lines"
        self.label = label
        self.writer = writer
        self.stop_step = stop_step
        self._bar = None
        self._task = None
        self._last_line = 0.0

    def end_step(self, state) -> int:
        """The step this invocation ends at."""
        return end_step(state, self.stop_step)

    def on_train_begin(self, args, state, control, **kw):
        if not state.is_world_process_zero or self.mode != "bar":
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
        from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from trainfit.terminal import console

        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=console(stderr=True), transient=False,
        )
        end = self.end_step(state)
        label = self.label if end == state.max_steps else f"{self.label} (to step {end} of {state.max_steps})"
        self._bar.start()
        self._task = self._bar.add_task(label, total=end, completed=min(state.global_step, end), loss="-")

    def on_log(self, args, state, control, logs=None, **kw):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=state.global_step, loss=f"{logs['loss']:.4f}")
            return
        now = time.perf_counter()
        if now - self._last_line < 1.0 and state.global_step < self.end_step(state):
            return  # at most one line a second, plus the last step of this invocation
        self._last_line = now
        rec = self.writer.records[-1] if self.writer.records else {}
        tps = rec.get("tokens_per_second")
        eta = rec.get("eta_seconds")
        print(f"step {state.global_step}/{state.max_steps} loss {logs['loss']:.4f} "
              f"lr {logs.get('learning_rate', 0):.3g}" + (f" tokens/s {tps:.0f}" if tps else "")
              + (f" ETA {_clock_text(eta)}" if eta is not None and state.global_step < self.end_step(state) else ""),
              file=sys.stderr, flush=True)

    def on_step_end(self, args, state, control, **kw):
        if self._bar is not None:
            self._bar.update(self._task, completed=state.global_step)

    def on_train_end(self, args, state, control, **kw):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _clock_text(seconds: float) -> str:
    """h:mm:ss (m:ss under an hour), as the progress bar shows its ETA."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
