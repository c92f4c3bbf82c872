"""The probe's measuring child, seen from the parent (trainfit.train.probe): started once (its
torch import overlaps the planning), fed one setting at a time (ProbeJob), read event by event,
and stopped when a setting runs past its time share; a setting's step time from what finished
(SettingResult)."""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup

# The child stops a setting itself at the end of its time share; the parent stops the child only
# this share later (a micro-batch still running): a stopped child is started again, paying torch's
# import and a cold first setting again (page faults, thread pools) for the next setting measured.
OVERRUN_SHARE = 0.5
UNTIMED_SPREAD = 0.25  # the spread given a step figure from fewer than two timed micro-batches

Log = Callable[[str], None]


@dataclass(frozen=True)
class ProbeJob:
    """One setting to measure: what the child builds and how long it may take."""

    index: int
    spec: ModelSpec  # the model to build (the whole model, or a slice of its layers)
    setup: TrainingSetup
    share_seconds: float
    device: str  # torch device type: "cpu", "cuda", "mps"


@dataclass
class SettingResult:
    index: int
    step_seconds: float | None = None
    lower_bound: bool = False
    how: str = ""
    error: str | None = None
    micro_seconds: list[float] = field(default_factory=list)  # timed (after the warm-up)
    optimizer_seconds: list[float] = field(default_factory=list)
    warm_micro: list[float] = field(default_factory=list)
    warm_optimizer: list[float] = field(default_factory=list)
    warm_faults: list[int] = field(default_factory=list)  # minor page faults of each warm-up micro-batch
    wall_seconds: float = 0.0
    spread: float = 0.0  # relative spread of the timed micro-batches (micro_spread)


class ProbeSession:
    """The measuring child process: started once, restarted after a setting had to be stopped."""

    def __init__(self, log: Log, warm_spec: ModelSpec | None = None) -> None:
        self.log = log
        self.warm_spec = warm_spec  # its model code is imported while the child starts
        self.proc: subprocess.Popen | None = None
        self.started = False
        self.lines: queue.Queue = queue.Queue()

    def launch(self) -> None:
        """Start the child now (its torch import overlaps the planning); `ready` waits for it."""
        if self.proc is None:
            self._spawn()

    def ready(self, deadline: float) -> bool:
        """The child is up and has imported torch (started again when it was stopped)."""
        if self.proc is None:
            self._spawn()
        if self.started:
            return True
        while True:
            event = self._next(deadline)
            if event is None:
                self.close()
                return False
            if event.get("event") == "ready":
                self.started = True
                return True

    def _spawn(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
        src = str(Path(__file__).resolve().parents[2])  # the trainfit this process runs, for the child too
        env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
        from trainfit.core.serde import to_jsonable

        warm = [json.dumps(to_jsonable(self.warm_spec))] if self.warm_spec is not None else []
        self.proc = subprocess.Popen([sys.executable, "-m", "trainfit.train.probe_child", "--child", *warm], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.lines = queue.Queue()
        self.started = False
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                lines.put(json.loads(line))
            except ValueError:
                continue
        lines.put({"event": "exit"})

    def _next(self, deadline: float) -> dict | None:
        try:
            event = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        return None if event.get("event") == "exit" else event

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # our own child, by its handle
            self.proc.wait()
            self.proc = None
            self.started = False

    def measure(self, job: ProbeJob, deadline: float) -> SettingResult:
        """Run one setting for its time share, counted from when its model is built (the build
        pays imports once per architecture), and never past `deadline` (monotonic)."""
        from trainfit.core.serde import to_jsonable

        res = SettingResult(job.index)
        started = time.monotonic()
        if not self.ready(deadline):
            res.error = "the probe process did not start in time (importing torch)"
            return res
        assert self.proc is not None and self.proc.stdin is not None
        body = {"index": job.index, "spec": to_jsonable(job.spec), "setup": to_jsonable(job.setup),
                "share_seconds": job.share_seconds, "device": job.device}
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        built_at = None
        while True:
            event = self._next(deadline if built_at is None else
                               min(deadline, built_at + job.share_seconds * (1 + OVERRUN_SHARE)))
            if event is None:  # stopped at its time share (or the child died): what it finished counts
                stopped = self.proc is not None and self.proc.poll() is None
                code = None if stopped or self.proc is None else self.proc.poll()
                self.close()
                res.wall_seconds = time.monotonic() - started
                if not stopped:  # e.g. killed by the kernel for memory: a finding, not a time-out
                    res.error = f"the probe process ended (exit code {code}) while running this setting"
                return _finish(res, job, built_at, stopped=stopped)
            kind = event.get("event")
            if kind == "built":
                built_at = time.monotonic()
            elif kind in ("micro", "optimizer"):
                timed = res.micro_seconds if kind == "micro" else res.optimizer_seconds
                warm = res.warm_micro if kind == "micro" else res.warm_optimizer
                (warm if event.get("warmup") else timed).append(event["seconds"])
                if kind == "micro" and event.get("warmup") and event.get("faults") is not None:
                    res.warm_faults.append(event["faults"])
            elif kind == "error":
                res.error = event.get("message", "failed")
                res.wall_seconds = time.monotonic() - started
                return res
            elif kind == "done":
                res.wall_seconds = time.monotonic() - started
                return _finish(res, job, built_at, stopped=False)


def _finish(res: SettingResult, job: ProbeJob, built_at: float | None, *, stopped: bool) -> SettingResult:
    """Step time from what finished: accumulation x median micro-batch + median optimizer step
    (the warm-up ones only when no timed one finished: they run slower, so the figure errs high)."""
    accum = job.setup.grad_accum
    micro = res.micro_seconds or res.warm_micro
    optim = res.optimizer_seconds or res.warm_optimizer
    tail = " (stopped at its time share)" if stopped else ""
    if micro:
        res.step_seconds = accum * statistics.median(micro) + (statistics.median(optim) if optim else 0.0)
        res.lower_bound = not optim  # the optimizer step left out
        # fewer than two timed micro-batches show no spread: counted as large, not as none
        res.spread = micro_spread(res.micro_seconds) if len(res.micro_seconds) >= 2 else UNTIMED_SPREAD
        res.how = (f"{len(res.warm_micro)} warm-up + {len(res.micro_seconds)} timed micro-batches, "
                   f"{len(res.optimizer_seconds)} timed optimizer steps, spread {res.spread:.0%}"
                   if res.micro_seconds else "the warm-up micro-batches only") + tail
        return res
    if built_at is not None and stopped:
        # No micro-batch finished within the share: one takes at least as long as it ran.
        res.step_seconds = accum * (time.monotonic() - built_at)
        res.lower_bound = True
        res.how = "no micro-batch finished within its time share: at least this slow"
        return res
    res.error = res.error or "stopped before the model was built (time share too short)"
    return res


def micro_spread(seconds: list[float]) -> float:
    """Relative spread of one setting's timed micro-batches: twice their median absolute deviation
    over their median (the interquartile range of normal noise; unlike the range or the
    interquartile range of four, a single stall, another process taking the core, moves it little)."""
    if len(seconds) < 2:
        return 0.0
    mid = statistics.median(seconds)
    return 2 * statistics.median(abs(x - mid) for x in seconds) / mid if mid > 0 else 0.0
