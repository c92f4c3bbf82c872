"""The three ways into the live monitor (trainfit.train.monitor.live.Monitor):

* any Transformers Trainer: `Trainer(..., callbacks=[MonitorCallback(metrics_path=...)])`;
* any PyTorch loop: `with monitor_training("run/metrics.jsonl", total_steps=N) as mon: ... mon.step(loss=...)`;
* `trainfit train`: the runner adds `build_monitor(...)` to its callbacks.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainfit.train.monitor.live import DEFAULT_INTERVAL_SECONDS, Monitor


# ---- Transformers Trainer ---------------------------------------------------------------------

def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def warn_on_leak(say: Callable[[str], None] = _say) -> Callable[[dict[str, Any]], None]:
    """An on_event handler that prints memory_leak events as warnings."""
    def on_event(rec: dict[str, Any]) -> None:
        if rec.get("event") == "memory_leak":
            say(f"warning: possible memory leak: {rec['reason']}")
    return on_event


# What MonitorCallback does not do outside `trainfit train` (docs/monitoring.md says the same).
PROTECTION_NOTE = (
    "trainfit MonitorCallback: monitoring only (machine samples, ETA, loss lines and leak warnings in "
    "metrics.jsonl). Out-of-memory recovery, the precision fallback, memory-pressure shrinking and thermal / "
    "battery pauses need `trainfit train`: they restart the Trainer with another split or precision, which a "
    "callback cannot do. For NaN / inf gradients add trainfit.train.monitor.run_policies.NonFiniteGuard() to the "
    "callbacks (skips those updates, never saves non-finite weights).")


class _MonitorCallbackLogic:
    """Runs a Monitor for any Transformers Trainer (main process only).

    the first on_step_begin starts the sampling thread (and the dashboard when asked), on_step_end feeds the
    step (samples = per-device batch x accumulation x processes; tokens from the Trainer's
    num_input_tokens_seen when it counts them), on_log feeds the logged loss and, with `tokens_fn`
    (the running token count, called at logging steps only), the token rate; on_train_end stops both.

    total_steps: where this training stops when earlier than the Trainer's max_steps (e.g. a
    --max-steps stop); the ETA counts to min(total_steps, max_steps).
    dashboard: False, True, or a function monitor -> object with start() / stop().
    shape: the batch shape for the leak detector, e.g. (micro_batch, seq_len).
    progress: a trainfit Progress callback whose rich bar the dashboard should share (rich draws
    two live displays on one console as one).
    managed: set by `trainfit train`, whose runner protects the training itself. Otherwise the
    callback says once, when training starts, what it does not do (PROTECTION_NOTE).
    """

    def __init__(self, metrics_path: str | os.PathLike | None = None, *, monitor: Monitor | None = None,
                 interval_seconds: float = DEFAULT_INTERVAL_SECONDS, total_steps: int | None = None,
                 dashboard: Any = False, tokens_fn: Callable[[], float] | None = None, shape: Any = None,
                 progress: Any = None, say: Callable[[str], None] | None = _say, enabled: bool = True,
                 managed: bool = False, **monitor_kwargs: Any) -> None:
        self.enabled = enabled
        self.say = say
        self.managed = managed
        monitor_kwargs.setdefault("write_steps", True)  # a folder `trainfit report` reads
        on_event = monitor_kwargs.pop("on_event", None) or (warn_on_leak(say) if say is not None else None)
        self.monitor = monitor if monitor is not None else Monitor(
            metrics_path, interval_seconds=interval_seconds, total_steps=total_steps, on_event=on_event,
            **monitor_kwargs)
        self.stop_step = total_steps
        self.dashboard = dashboard
        self.tokens_fn = tokens_fn
        self.shape = shape
        self.progress = progress
        self._dash: Any = None
        self._samples_per_step: float | None = None
        self._active = False
        self._started = False  # once per training attempt (on_train_end resets it)

    def on_step_begin(self, args, state, control, **kw):
        # Started with the first step, not at train begin: a resumed checkpoint (weights, optimizer,
        # RNG states) is loaded by then, so a resume that fails while loading writes nothing.
        if not self._active and not self._started:
            self._started = True
            self._begin(args, state)

    def _begin(self, args, state) -> None:
        if not self.enabled or not state.is_world_process_zero or self._active:
            return
        if state.max_steps and state.max_steps > 0:
            self.monitor.total_steps = (min(self.stop_step, state.max_steps) if self.stop_step is not None
                                        else state.max_steps)
        self._samples_per_step = float(args.per_device_train_batch_size * args.gradient_accumulation_steps
                                       * max(args.world_size, 1))
        self.monitor.current_step = state.global_step  # a resumed run counts on from its checkpoint
        if not self.managed and self.say is not None:
            self.say(PROTECTION_NOTE)
            self.managed = True  # once
        self.monitor.start()
        self._active = True
        # a training that raises never reaches on_train_end: stop the display and the thread at exit
        atexit.register(self.close)
        if self.dashboard:
            self._start_dashboard()

    def _start_dashboard(self) -> None:
        try:
            if callable(self.dashboard) and not isinstance(self.dashboard, bool):
                self._dash = self.dashboard(self.monitor)
            else:
                from trainfit.train.monitor.dashboard import Dashboard

                bar = getattr(self.progress, "_bar", None)  # share the progress bar's console
                self._dash = Dashboard(self.monitor, console=getattr(bar, "console", None))
            self._dash.start()
        except Exception as exc:  # a display problem must not stop the training
            self._dash = None
            self.monitor.emit("monitor_error", f"the dashboard could not start: {type(exc).__name__}: {exc}")

    def on_step_end(self, args, state, control, **kw):
        if not self._active:
            return
        seen = getattr(state, "num_input_tokens_seen", 0) or None
        self.monitor.step(state.global_step, samples=self._samples_per_step, tokens_seen=seen, shape=self.shape)

    def on_log(self, args, state, control, logs=None, **kw):
        if not self._active or not logs:
            return
        metrics = {k: logs[k] for k in ("loss", "learning_rate", "grad_norm") if logs.get(k) is not None}
        tokens = None
        if self.tokens_fn is not None:
            try:
                tokens = float(self.tokens_fn())
            except Exception:
                tokens = None
        if metrics or tokens is not None:
            self.monitor.update(state.global_step, tokens_seen=tokens, **metrics)

    def on_train_end(self, args, state, control, **kw):
        self.close()
        self._started = False

    def close(self) -> None:
        """Stop the dashboard and the monitor (also safe when training failed half-way)."""
        if not self._active:
            return
        self._active = False
        atexit.unregister(self.close)
        if self._dash is not None:
            try:
                self._dash.stop()
            except Exception:
                pass
            self._dash = None
        self.monitor.stop()


_CALLBACK_CLASS: type | None = None


def monitor_callback_class() -> type:
    """MonitorCallback: built on first use, so that importing this module (e.g. for
    monitor_training around a plain PyTorch loop) does not import transformers (seconds)."""
    global _CALLBACK_CLASS
    if _CALLBACK_CLASS is None:
        from transformers import TrainerCallback

        _CALLBACK_CLASS = type("MonitorCallback", (_MonitorCallbackLogic, TrainerCallback),
                               {"__module__": __name__, "__doc__": _MonitorCallbackLogic.__doc__})
    return _CALLBACK_CLASS


def __getattr__(name: str) -> Any:  # `from trainfit.train.monitor.callback import MonitorCallback`
    if name == "MonitorCallback":
        return monitor_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- any PyTorch loop -------------------------------------------------------------------------

@contextmanager
def monitor_training(metrics_path: str | os.PathLike | None = None, *,
                     interval_seconds: float = DEFAULT_INTERVAL_SECONDS, total_steps: int | None = None,
                     dashboard: bool | str = False, predicted_peak_bytes: int | None = None,
                     say: Callable[[str], None] | None = _say, **monitor_kwargs: Any) -> Iterator[Monitor]:
    """Monitor a hand-written training loop:

        with monitor_training("run/metrics.jsonl", total_steps=1000) as mon:
            for batch in data:
                loss = train_step(batch)
                mon.step(loss=loss, tokens=batch.numel(), samples=len(batch))

    dashboard: True / "on" shows it, "auto" when stderr is a terminal, False / "off" never.
    """
    on_event = monitor_kwargs.pop("on_event", None) or (warn_on_leak(say) if say is not None else None)
    monitor_kwargs.setdefault("write_steps", True)  # a folder `trainfit report` reads
    mon = Monitor(metrics_path, interval_seconds=interval_seconds, total_steps=total_steps,
                  predicted_peak_bytes=predicted_peak_bytes, on_event=on_event, **monitor_kwargs)
    mon.start()
    dash = None
    if dashboard_wanted(dashboard, interactive=_stderr_is_tty()):
        from trainfit.train.monitor.dashboard import Dashboard

        try:
            dash = Dashboard(mon)
            dash.start()
        except Exception as exc:
            dash = None
            mon.emit("monitor_error", f"the dashboard could not start: {type(exc).__name__}: {exc}")
    try:
        yield mon
    finally:
        if dash is not None:
            dash.stop()
        mon.stop()


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def dashboard_wanted(setting: bool | str, *, interactive: bool) -> bool:
    """auto: on a terminal only; on / True: always; off / False: never."""
    if isinstance(setting, bool):
        return setting
    return setting == "on" or (setting == "auto" and interactive)


# ---- trainfit train ---------------------------------------------------------------------------

def build_monitor(run_dir: str | os.PathLike, *, predicted_peak_bytes: int | None = None,
                  total_steps: int | None = None, interval_seconds: float | None = None,
                  interactive: bool = False, settings: Any = None, tokens_fn: Callable[[], float] | None = None,
                  progress: Any = None, shape: Any = None,
                  say: Callable[[str], None] | None = _say, **monitor_kwargs: Any) -> Any:
    """The MonitorCallback (a transformers TrainerCallback) `trainfit train` adds to its Trainer.

    settings: the run config's `monitoring:` section (RunConfig.monitoring); interval_seconds,
    when given, overrides its interval. total_steps: the --max-steps stop (None: the schedule's
    end). interactive: the runner's terminal decision (the dashboard's `auto`). tokens_fn: the
    running token count (called at logging steps). progress: the Progress callback (the dashboard
    shares its rich console). Samples go to RUN_DIR/metrics.jsonl. monitor_kwargs: more Monitor
    arguments (sampler, memory_fn, leak_detector, leak_read_seconds, on_event).
    """
    enabled = getattr(settings, "enabled", True)
    interval = interval_seconds if interval_seconds is not None else getattr(
        settings, "interval_seconds", DEFAULT_INTERVAL_SECONDS)
    dash = dashboard_wanted(getattr(settings, "dashboard", "auto"), interactive=interactive)
    return monitor_callback_class()(
        Path(run_dir) / "metrics.jsonl", interval_seconds=interval, total_steps=total_steps, dashboard=dash,
        tokens_fn=tokens_fn, shape=shape, progress=progress, say=say, enabled=enabled,
        predicted_peak_bytes=predicted_peak_bytes, leak_warning=getattr(settings, "leak_warning", True),
        write_steps=False, managed=True, **monitor_kwargs)
