"""The safety policies that watch the run (trainfit.train.monitor.safety): CadencePolicy (when to
checkpoint), SignalPolicy and StopAtTrainEnd (a clean stop), and NonFiniteGuard for any Trainer."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

# The cadence rule and the checkpoint-cost assumptions live in core (the planner and `cloud --spot`
# price the same interval the trainer uses).
from trainfit.core.run.checkpoint_cadence import (ASSUMED_CHECKPOINT_FIXED_SECONDS, ASSUMED_WRITE_BYTES_PER_SECOND,
                                              OPTIMIZER_BYTES_PER_TRAINABLE, cadence_interval,
                                              combined_interruption_seconds)
from trainfit.train.monitor.safety_context import Log, SafetyContext, TrainingStopped, at_last_step

EXIT_SIGNAL_BASE = 128  # exit code 128 + N for a stop by signal N (130 SIGINT, 143 SIGTERM)


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
    Trainer has ended (so the callbacks before this one, e.g. the progress bar, closed cleanly).
    `latest_checkpoint`: (checkpoints folder) -> the newest complete checkpoint's path or None
    (`trainfit train` passes trainfit.train.recovery.rollback.latest_checkpoint)."""

    def __init__(self, ctx: SafetyContext, signals: SignalPolicy | None = None,
                 latest_checkpoint: Callable[[Path], str | None] | None = None) -> None:
        self.ctx = ctx
        self.signals = signals
        self.latest_checkpoint = latest_checkpoint

    def on_train_end(self, args, state, control, **kw):
        if self.signals is not None:
            self.signals.restore()
        stop = self.ctx.stop
        if stop is None:
            return
        if stop.kind == "signal" and at_last_step(state):
            self.ctx.log(f"{stop.message} at the last step: the run is complete")  # nothing to resume
            return
        raise TrainingStopped(f"stopped at step {state.global_step} of {state.max_steps}: {stop.message}; "
                              f"{self._newest_checkpoint(state.global_step)}",
                              exit_code=stop.exit_code, hint=self.ctx.resume_command(), step=state.global_step,
                              kind=stop.kind)

    def _newest_checkpoint(self, step: int) -> str:
        """Where the run continues from: normally the checkpoint of this step, just written."""
        if self.ctx.run_dir is None or self.latest_checkpoint is None:
            return f"checkpoint-{step} is written"
        newest = self.latest_checkpoint(Path(self.ctx.run_dir) / "checkpoints")
        if newest is None:
            return "no checkpoint was written: --resume would start from step 0"
        newest_step = int(Path(newest).name.split("-")[-1])
        return (f"{newest} is written" if newest_step == step
                else f"the newest checkpoint is {newest} (step {newest_step})")


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
