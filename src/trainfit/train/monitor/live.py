"""The live monitor: machine samples while training runs, training speed, ETA, memory-leak warning.

A `Monitor` owns a daemon thread that takes one `Sample` (hardware/sampling.py) every
`interval_seconds`, appends its record to metrics.jsonl (`{"event": "sample", "step": N, ...}`,
through train/monitor/events.append_record, which every writer of that file uses), keeps a bounded
history and hands each sample to its subscribers (the safety policies subscribe; a subscriber that
raises becomes one `monitor_subscriber_error` event and keeps receiving samples).

The training loop feeds it numbers only: `monitor.step(...)` once per optimizer step (loss,
tokens, samples; the step time is measured between calls) and `monitor.update(...)` for logged
metrics. Everything slow (sampling, writing, the leak fit, the dashboard) happens in other
threads; the per-step hook costs a few microseconds (bench/monitor_overhead.py).

The leak fit lives in leaks.py, MonitorCallback / monitor_training / build_monitor (the three ways
in) in callback.py.
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.hardware.sample_types import Sample
from trainfit.train.monitor.events import append_record, event
from trainfit.train.monitor.leaks import LeakDetector

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 1.0
RECENT_STEPS = 20  # step times the ETA and the speed figures take the median of


@dataclass(frozen=True)
class StepPoint:
    """What the training loop reported for one optimizer step."""

    step: int
    time: float  # time.perf_counter() at the step's end
    step_seconds: float | None  # since the previous step's end (data loading and logging included)
    tokens: float | None
    samples: float | None
    tokens_seen: float | None


class Monitor:
    """Samples the machine in a thread and follows the training (see the module doc).

    metrics_path: metrics.jsonl to append to (None: keep everything in memory only).
    sampler: a Sampler-like object (`sample()`, `close()`), or a function that makes one (called
    in the monitor's thread); default: hardware.sampling.Sampler() of this machine.
    total_steps: the step training ends at (for the ETA); can be set later.
    predicted_peak_bytes: the memory model's prediction, shown by the dashboard.
    leak_warning: run the leak detector (`leak_detector` to tune it).
    on_event: called with every event record the monitor writes (e.g. to print warnings).
    memory_fn: () -> (bytes, kind), the reading the leak detector takes at a step end (default:
    torch's CUDA allocator when CUDA is in use, else the process RSS).
    write_steps: append a logged-step line ({"step", "loss", "step_seconds", "tokens_per_second",
    "eta_seconds", "peak_rss_bytes", ...}, as `trainfit train` writes them) for every loss reported,
    so that `trainfit report` can read the folder (MonitorCallback and monitor_training turn it on).
    """

    def __init__(self, metrics_path: str | os.PathLike | None = None, *,
                 interval_seconds: float = DEFAULT_INTERVAL_SECONDS, total_steps: int | None = None,
                 sampler: Any = None, predicted_peak_bytes: int | None = None, leak_warning: bool = True,
                 leak_detector: LeakDetector | None = None, history_samples: int = 3600,
                 history_steps: int = 10_000, on_event: Callable[[dict[str, Any]], None] | None = None,
                 leak_read_seconds: float | None = None, leak_check_seconds: float = 5.0,
                 memory_fn: Callable[[], tuple[int | None, str]] | None = None, write_steps: bool = False) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be positive, got {interval_seconds!r}")
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.interval_seconds = float(interval_seconds)
        self.total_steps = total_steps
        self.predicted_peak_bytes = predicted_peak_bytes
        self._sampler_spec = sampler
        self.leak_detector = (leak_detector or LeakDetector()) if leak_warning else None
        # one memory reading at a step end per leak_read_seconds (the thread asks for it; 0: every
        # step end), one fit
        # per leak_check_seconds: the leak detector costs the training one psutil / allocator read
        # a second, and the thread a fraction of a millisecond every few seconds
        self.leak_read_seconds = max(self.interval_seconds, 1.0) if leak_read_seconds is None else leak_read_seconds
        self.leak_check_seconds = leak_check_seconds
        self._last_read_request = self._last_fit = float("-inf")
        self._on_event = on_event
        self._memory_fn = memory_fn  # (bytes, kind) for the leak detector; None: _read_memory
        # write a {"step", "loss", ...} line per reported loss (`trainfit train` writes its own)
        self.write_steps = write_steps
        self._step_lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=4096)
        self._lines_lock = threading.Lock()
        self._lock = threading.Lock()
        self._samples: collections.deque[Sample] = collections.deque(maxlen=history_samples)
        self._steps: collections.deque[StepPoint] = collections.deque(maxlen=history_steps)
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)
        self._events_emitted = 0  # ever: events_since's readers pass back the count they have seen
        self._readings: collections.deque[tuple[int, int, Any]] = collections.deque()  # leak readings to fit
        # (step, loss): floats, and tensors the monitor thread reads (a .item() there blocks that
        # thread, never the training loop)
        self._losses: collections.deque[tuple[int, float]] = collections.deque(maxlen=history_steps)
        self._pending_losses: collections.deque[tuple[int, Any]] = collections.deque(maxlen=1024)
        self._subscribers: list[Callable[[Sample], Any]] = []
        self._failed_subscribers: dict[int, int] = {}  # id(fn) -> failures
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._want_memory = False
        self._proc: Any = None
        self._step = 0
        self._first_step: int | None = None
        self._last_step_t: float | None = None
        self._tokens_seen: float | None = None
        self._samples_seen = 0.0
        self._train_seconds = 0.0  # sum of the step times: the clock the rates are measured on
        self._marks: collections.deque[tuple[float, float | None, float]] = collections.deque(maxlen=256)
        self._metrics: dict[str, Any] = {}  # latest logged metrics (loss, learning_rate, ...)
        self._started_at: float | None = None
        self._errors_seen: set[str] = set()
        self.write_error: str | None = None
        self.sample_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        self.thread_cpu_seconds: float | None = None  # CPU time the monitor thread used (after stop)
        self.setup_cpu_seconds: float | None = None  # of which: making the sampler (NVML init, ...)

    # -- lifetime ---------------------------------------------------------------------------------
    def start(self) -> "Monitor":
        if self._thread is not None:
            return self
        self._stop.clear()
        self._started_at = self._last_step_t = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="trainfit-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float | None = None) -> None:
        """Stop the thread (a sample in progress finishes), fit the last readings, close the sampler."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_seconds if timeout_seconds is not None else max(5.0, 2 * self.interval_seconds))
        if thread.is_alive():  # a sampler stuck in a driver call: the daemon thread dies with the process
            self.emit("monitor_error", "the monitor thread did not stop in time (a hardware read hangs?)")
        self._read_losses()
        self._write_step_lines()
        self._check_leaks()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- subscribers ------------------------------------------------------------------------------
    def subscribe(self, fn: Callable[[Sample], Any]) -> Callable[[Sample], Any]:
        """Call fn(sample) in the monitor thread after every sample (usable as a decorator)."""
        with self._lock:
            self._subscribers.append(fn)
        return fn

    def unsubscribe(self, fn: Callable[[Sample], Any]) -> None:
        with self._lock:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

    # -- the training loop's side (cheap) ---------------------------------------------------------
    def step(self, step: int | None = None, *, loss: Any = None, tokens: float | None = None,
             samples: float | None = None, tokens_seen: float | None = None, step_seconds: float | None = None,
             memory_bytes: int | None = None, shape: Any = None) -> None:
        """One optimizer step ended. `step`: its number (default: the previous + 1); `tokens` /
        `samples`: trained in this step (or `tokens_seen`: the running total); `loss`: a float or
        a tensor (kept detached, read later); `step_seconds`: default, the time since the previous
        call; `memory_bytes`: a memory reading for the leak detector (default: read here when the
        monitor thread asked for one, at most once per leak_read_seconds); `shape`: the batch
        shape, e.g. (micro_batch, seq_len): leak readings are compared within one shape."""
        now = time.perf_counter()
        step = self._step + 1 if step is None else int(step)
        if step_seconds is None and self._last_step_t is not None:
            step_seconds = now - self._last_step_t
        self._last_step_t = now
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()  # no graph kept alive, no device sync here
        if tokens_seen is None and tokens is not None:
            tokens_seen = (self._tokens_seen or 0.0) + tokens
        if tokens_seen is not None:
            self._tokens_seen = float(tokens_seen)
        if samples is not None:
            self._samples_seen += samples
        kind = None
        # leak_read_seconds 0: a reading at every step end, however fast the steps come (the
        # thread's request would arrive once per tick and miss most of a fast run's steps)
        every_step = self.leak_read_seconds <= 0
        if memory_bytes is None and (self._want_memory or every_step) and self.leak_detector is not None:
            self._want_memory = False
            memory_bytes, kind = self._memory_fn() if self._memory_fn is not None else self._read_memory()
        point = StepPoint(step, now, step_seconds, tokens, samples, self._tokens_seen)
        with self._lock:
            if self._first_step is None:
                self._first_step = step
            self._step = step
            self._steps.append(point)
            self._train_seconds += step_seconds or 0.0
            self._marks.append((self._train_seconds, self._tokens_seen, self._samples_seen))
            if loss is not None:
                self._metrics["loss"] = loss
                self._metrics["loss_step"] = step
                if isinstance(loss, (int, float)):
                    self._losses.append((step, float(loss)))
                else:
                    self._pending_losses.append((step, loss))
            if memory_bytes is not None and self.leak_detector is not None:
                self._readings.append((step, int(memory_bytes), (shape, kind or "memory")))
        if self.write_steps and loss is not None:
            self._step_lines.append(self._line_of(step, loss, step_seconds))

    def update(self, step: int | None = None, *, tokens_seen: float | None = None, **metrics: Any) -> None:
        """Logged metrics (loss, learning_rate, ...) or the running token count, without a step."""
        with self._lock:
            if tokens_seen is not None:
                self._tokens_seen = float(tokens_seen)
                self._marks.append((self._train_seconds, self._tokens_seen, self._samples_seen))
            for k, v in metrics.items():
                self._metrics[k] = v.detach() if hasattr(v, "detach") else v
            if "loss" in metrics:
                at = step if step is not None else self._step
                self._metrics["loss_step"] = at
                self._pending_losses.append((at, self._metrics["loss"]))
                last = self._steps[-1] if self._steps and self._steps[-1].step == at else None
        if self.write_steps and "loss" in metrics:
            self._step_lines.append(self._line_of(at, self._metrics["loss"], last.step_seconds if last else None))

    def _read_memory(self) -> tuple[int | None, str]:
        """(bytes, kind): torch's CUDA allocator when this process uses CUDA, else the RSS."""
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                return int(torch.cuda.memory_allocated()), "cuda_allocated"
        except Exception:
            pass
        try:
            if self._proc is None:
                import psutil

                self._proc = psutil.Process()
            return int(self._proc.memory_info().rss), "process_rss"
        except Exception:
            return None, "process_rss"

    # -- events -----------------------------------------------------------------------------------
    def emit(self, kind: str, reason: str, **details: Any) -> dict[str, Any]:
        """Write one event record (metrics.jsonl, the dashboard's list, on_event)."""
        rec = event(kind, self._step, reason, **details)
        with self._lock:
            self._events.append(rec)
            self._events_emitted += 1
        self._write(rec)
        if self._on_event is not None:
            try:
                self._on_event(rec)
            except Exception:  # printing a warning must never stop the monitor
                log.exception("monitor on_event failed")
        return rec

    def _write(self, rec: dict[str, Any]) -> None:
        if self.metrics_path is None or self.write_error is not None:
            return
        try:
            append_record(self.metrics_path, rec)
        except OSError as exc:  # disk full, run dir removed: keep monitoring in memory
            self.write_error = f"cannot append to {self.metrics_path}: {exc}"
            log.warning("trainfit monitor: %s; samples are no longer written", self.write_error)

    # -- the thread -------------------------------------------------------------------------------
    def _make_sampler(self) -> Any:
        spec = self._sampler_spec
        if spec is None:
            from trainfit.hardware.sampling import Sampler

            return Sampler()
        if callable(spec) and not hasattr(spec, "sample"):
            return spec()
        return spec

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            sampler = self._make_sampler()
        except Exception as exc:
            self.emit("monitor_error", f"the machine cannot be sampled: {type(exc).__name__}: {exc}; "
                      "training goes on without samples")
            sampler = None
        self.setup_cpu_seconds = time.thread_time() - cpu0
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self._tick(sampler)
                next_t += self.interval_seconds
                delay = next_t - time.monotonic()
                if delay < 0:  # a slow sample: skip the missed ticks rather than bunch them
                    next_t, delay = time.monotonic(), 0.0
                self._stop.wait(delay)
        finally:
            if sampler is not None:
                try:
                    sampler.close()
                except Exception:
                    pass
            self.thread_cpu_seconds = time.thread_time() - cpu0

    def _tick(self, sampler: Any) -> None:
        now = time.monotonic()
        if self.leak_detector is not None and now - self._last_read_request >= self.leak_read_seconds:
            self._want_memory = True  # one memory reading at the next step end
            self._last_read_request = now
        if sampler is not None:
            t0 = time.perf_counter()
            try:
                sample = sampler.sample()
            except Exception as exc:  # the sampler guards every read; this is a bug, reported once
                self._error_once(f"sampling {type(exc).__name__}",
                                 f"sampling failed: {type(exc).__name__}: {exc}; further failures of this kind "
                                 "are not logged")
                sample = None
            self.sample_seconds.append(time.perf_counter() - t0)
            if sample is not None:
                with self._lock:
                    self._samples.append(sample)
                    subscribers = list(self._subscribers)
                self._write({**sample.to_record(), "step": self._step})
                for fn in subscribers:
                    self._notify(fn, sample)
        self._read_losses()
        self._write_step_lines()
        self._check_leaks(force=False)

    def _line_of(self, step: int, loss: Any, step_seconds: float | None) -> dict[str, Any]:
        """A logged-step line (write_steps), its figures as of now; the loss may still be a tensor
        (read in the monitor's thread, never in the training loop)."""
        return {"step": step, "loss": loss, "step_seconds": step_seconds, **self.rates(),
                "eta_seconds": self.eta_seconds(),
                "elapsed_seconds": time.perf_counter() - self._started_at if self._started_at is not None else None,
                "time": time.time()}

    def _write_step_lines(self) -> None:
        """Write the logged-step lines reported since the last tick, in order (the thread and
        stop() may both get here)."""
        with self._lines_lock:
            while self._step_lines:
                line = self._step_lines.popleft()
                self._write({**line, "loss": _as_float(line["loss"]), "peak_rss_bytes": peak_rss_bytes()})

    def _read_losses(self) -> None:
        while self._pending_losses:
            step, loss = self._pending_losses.popleft()
            value = _as_float(loss)
            if value is not None:
                with self._lock:
                    self._losses.append((step, value))

    def _notify(self, fn: Callable[[Sample], Any], sample: Sample) -> None:
        try:
            fn(sample)
        except Exception as exc:
            n = self._failed_subscribers.get(id(fn), 0)
            self._failed_subscribers[id(fn)] = n + 1
            if n == 0:
                name = getattr(fn, "__qualname__", None) or type(fn).__name__
                self.emit("monitor_subscriber_error",
                          f"monitor subscriber {name} raised {type(exc).__name__}: {exc}; it keeps receiving "
                          f"samples and further errors from it are counted, not logged",
                          subscriber=name, error=f"{type(exc).__name__}: {exc}")

    def _error_once(self, key: str, reason: str) -> None:
        if key not in self._errors_seen:
            self._errors_seen.add(key)
            self.emit("monitor_error", reason)

    def _check_leaks(self, force: bool = True) -> None:
        det = self.leak_detector
        if det is None:
            return
        while self._readings:
            step, value, key = self._readings.popleft()
            det.add(step, value, key)
        now = time.monotonic()
        if not det.pending or not force and now - self._last_fit < self.leak_check_seconds:
            return
        self._last_fit = now
        try:
            findings = det.check(seconds_per_step=self.seconds_per_step(), headroom_bytes=self._headroom)
        except Exception as exc:
            self._error_once(f"leak {type(exc).__name__}", f"leak check failed: {type(exc).__name__}: {exc}")
            return
        for f in findings:
            self.emit("memory_leak", f.reason(), **f.details())

    def _headroom(self, kind: str) -> int | None:
        s = self.latest_sample
        if s is None:
            return None
        if kind == "cuda_allocated":
            gpus = [g for g in s.gpus if g.allocated_bytes is not None and g.memory_total_bytes is not None
                    and g.memory_used_bytes is not None]
            if gpus:
                g = max(gpus, key=lambda g: g.allocated_bytes or 0)
                return g.memory_total_bytes - g.memory_used_bytes  # type: ignore[operator]
            return None
        h = s.host
        if h.ram_total_bytes is not None and h.ram_used_bytes is not None:
            return h.ram_total_bytes - h.ram_used_bytes
        return None

    # -- views (any thread) -----------------------------------------------------------------------
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    @property
    def latest_sample(self) -> Sample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def steps(self) -> list[StepPoint]:
        with self._lock:
            return list(self._steps)

    def losses(self) -> list[tuple[int, float]]:
        """(step, loss) of the steps that reported one (tensors appear once the thread read them)."""
        with self._lock:
            return list(self._losses)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def events_since(self, seen: int) -> tuple[list[dict[str, Any]], int]:
        """The event records emitted after the first `seen` (of those kept: the last 100), and how many
        have been emitted: a reader that passes that count back next time reads each record once, at
        the cost of what is new, however long the run."""
        with self._lock:
            new = min(self._events_emitted - seen, len(self._events))
            return [self._events[i] for i in range(-new, 0)], self._events_emitted

    @property
    def current_step(self) -> int:
        return self._step

    @current_step.setter
    def current_step(self, step: int) -> None:
        """Count on from `step` (a resumed run, from its checkpoint)."""
        self._step = step

    def _recent_step_seconds(self) -> list[float]:
        with self._lock:
            return [p.step_seconds for p in list(self._steps)[-RECENT_STEPS:] if p.step_seconds is not None]

    def seconds_per_step(self) -> float | None:
        """Median wall seconds per step over the last RECENT_STEPS steps."""
        recent = self._recent_step_seconds()
        return statistics.median(recent) if recent else None

    def eta_seconds(self) -> float | None:
        """Steps left to total_steps x the recent median step time (None while either is unknown)."""
        return eta_seconds(None if self.total_steps is None else self.total_steps - self._step,
                           self._recent_step_seconds())

    def rates(self) -> dict[str, float | None]:
        """tokens/s and samples/s over the last ~RECENT_STEPS steps (their step times)."""
        with self._lock:
            marks = list(self._marks)
        out: dict[str, float | None] = {"tokens_per_second": None, "samples_per_second": None}
        if len(marks) < 2:
            return out
        first = marks[max(0, len(marks) - 1 - RECENT_STEPS)]
        last = marks[-1]
        dt = last[0] - first[0]
        if dt <= 0:
            return out
        if first[1] is not None and last[1] is not None:
            out["tokens_per_second"] = (last[1] - first[1]) / dt
        if last[2] > first[2]:
            out["samples_per_second"] = (last[2] - first[2]) / dt
        return out

    def status(self) -> dict[str, Any]:
        """One snapshot for displays: step, total, ETA, speed, loss, tokens seen, elapsed."""
        with self._lock:
            metrics = dict(self._metrics)
        loss = _as_float(metrics.get("loss"))
        return {
            "step": self._step, "total_steps": self.total_steps, "eta_seconds": self.eta_seconds(),
            "seconds_per_step": self.seconds_per_step(), **self.rates(), "loss": loss,
            "loss_step": metrics.get("loss_step"), "learning_rate": _as_float(metrics.get("learning_rate")),
            "tokens_seen": self._tokens_seen,
            "elapsed_seconds": time.perf_counter() - self._started_at if self._started_at is not None else None,
        }


def eta_seconds(steps_left: int | None, step_seconds: list[float]) -> float | None:
    """Steps left x the median of the last RECENT_STEPS step times (a checkpoint or a pause, not a
    step, does not swing it); None while either is unknown. The one ETA of metrics.jsonl, the
    progress line and the dashboard."""
    recent = step_seconds[-RECENT_STEPS:]
    if steps_left is None or not recent:
        return None
    return max(steps_left, 0) * statistics.median(recent)


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size (Linux reports KiB, macOS bytes); None on Windows."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except Exception:
        return None
