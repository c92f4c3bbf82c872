"""RecoverySession: the recovery state of one `run_training` call (what happens after each train()
attempt: a smaller split, another precision, a fresh process), and the thread-safe requests the
monitor and the safety policies make of the running training (trainfit.train.recovery)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import DoesNotFitError, TrainingDivergedError, UnavailableError
from trainfit.train.monitor.events import append_record, event
from trainfit.train.recovery.adjustments import (ADJUSTMENTS, REQUEST_DIR, Adjustments, apply_adjustments,
                                                 apply_request, clear_requests, save_adjustments, write_request)
from trainfit.train.recovery.callback import RecoveryCallback
from trainfit.train.recovery.oom import Failure, classify, free_device_memory
from trainfit.train.recovery.precision import (MAX_ACCUMULATION_RAISES, PrecisionPolicy, machine_profile,
                                               memory_precision, next_precision, supported_precisions)
from trainfit.train.recovery.restart import Relaunch, current_device_name, relaunch_in_fresh_process
from trainfit.train.recovery.rollback import (checkpoint_step, complete_checkpoint, latest_checkpoint,
                                              remove_newer_checkpoints, rng_restore, rng_snapshot, trim_steps_after)
from trainfit.train.recovery.split import Split, fit_micro_batch, shrink, with_split, with_training

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

_ACTIVE: "RecoverySession | None" = None
_ACTIVE_LOCK = threading.Lock()


def request_shrink(reason: str) -> bool:
    """Ask the running training to split its micro-batch at the next optimizer-step boundary (as
    after an OOM, before one happens). Thread-safe; False when no training runs in this process."""
    with _ACTIVE_LOCK:
        session = _ACTIVE
    return session.request("shrink", reason) if session is not None else False


def request_precision_fallback(reason: str) -> bool:
    """Ask the running training to fall back to the next precision (fp16 -> bf16 -> fp32) at the
    next optimizer-step boundary. Thread-safe; False when no training runs in this process."""
    with _ACTIVE_LOCK:
        session = _ACTIVE
    return session.request("fallback", reason) if session is not None else False


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    """Train again: with `cfg`, from `checkpoint` (None: from the start); `kind` and `reason`
    say why (the recovery's event kind and its sentence)."""

    cfg: "RunConfig"
    checkpoint: str | None
    kind: str = ""
    reason: str = ""


class RecoverySession:
    """The recovery state of one `run_training` call: owns adjustments.json, the step-boundary
    checks (its callback), and decides what happens after each train() attempt."""

    def __init__(self, run_dir: Path, user_cfg: "RunConfig", *, device: str, rank: int, world_size: int,
                 say, log, config_hash: str, stop_after: int | None, enabled: bool = True) -> None:
        self.run_dir = run_dir
        self.ckpt_dir = run_dir / "checkpoints"
        self.user_cfg = user_cfg
        self.device = device
        self.rank, self.world = rank, world_size
        self.say, self.log = say, log
        self.config_hash = config_hash
        self.stop_after = stop_after
        self.enabled = enabled
        self.metrics = run_dir / "metrics.jsonl" if rank == 0 else None
        self.adj = Adjustments()
        self.policy = PrecisionPolicy()
        self.cfg: RunConfig | None = None  # the config in force
        self.trainer = None
        self.callback = RecoveryCallback(self)
        self.attempts = 0
        self._lock = threading.Lock()
        self._requests: dict[str, str] = {}  # "shrink" / "fallback" -> reason (from any thread)
        self.refused: set[str] = set()
        self.pending: tuple[str, str, int] | None = None  # (what, reason, step) decided at a boundary
        self.fallback_from: int | None = None  # the last good step of a non-finite streak
        self.phase = "boundary"  # compute | optimizer | boundary: is the in-memory state a whole step?
        self.snapshot: tuple[int, dict[str, Any]] | None = None
        self.precision_override: str | None = None  # a precision a recovery chose (pinned in adjustments.json)

    # -- set-up -----------------------------------------------------------------------------
    def start(self, cfg: "RunConfig", adj: Adjustments, requests: list[dict[str, Any]], distributed_state) -> "RunConfig":
        """Fold the failed ranks' requests into the adjustments, agree across ranks, write them (rank
        0) and return the config in force."""
        global _ACTIVE
        base = cfg
        self.precision_override = adj.training.get("precision")
        for req in requests:
            if apply_request(base, adj, req, self.world):
                self.record_event(req.get("event", "oom_recovered" if req.get("kind") == "oom" else req.get("kind")),
                            req.get("step"), req.get("reason", ""),
                            **{k: v for k, v in req.items() if k not in ("config_hash", "reason", "step", "kind",
                                                                            "event", "time")})
        # (base has the adjustments applied already, and its precision made fit for the device)
        cfg = with_training(apply_adjustments(base, adj, self.world), precision=base.training.precision)
        if self.world > 1:
            cfg = self._agree_on_split(cfg)
        if requests or (not adj.empty and (adj.processes is None or adj.global_batch is None)):
            t = cfg.training
            adj.processes = adj.processes or self.world
            adj.global_batch = adj.global_batch or t.micro_batch * t.grad_accum * self.world
        distributed_state.wait_for_everyone()
        if self.rank == 0 and requests:
            self._store(adj, cfg)
            clear_requests(self.run_dir)
        distributed_state.wait_for_everyone()
        self.adj, self.cfg = adj, cfg
        if not adj.empty:
            self.log(f"recovery: rank {self.rank} trains with {Split.of(cfg).describe()}, "
                     f"precision {cfg.training.precision} (RUN_DIR/{ADJUSTMENTS})")
        with _ACTIVE_LOCK:
            _ACTIVE = self
        return cfg

    def close(self) -> None:
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None

    def _agree_on_split(self, cfg: "RunConfig") -> "RunConfig":
        """Every rank computed the split from the same files; a rank that saw them late (a network
        file system) must not differ: all take the smallest micro-batch any rank computed."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cfg
        views: list[Any] = [None] * self.world
        dist.all_gather_object(views, (Split.of(cfg).as_dict(), cfg.training.precision))
        split, precision = min(views, key=lambda v: (v[0]["micro_batch"], -v[0]["grad_accum"]))
        return with_training(with_split(cfg, Split(**split)), precision=precision)

    def replan_for_device(self, cfg: "RunConfig", spec, device: str,
                          precision_note: str | None = None) -> tuple["RunConfig", str]:
        """After a device failure, in the fresh process: the micro-batch the memory model says fits
        the device the run landed on (global batch kept), and the record of it (rank 0); (that
        config, why). The precision was made one the device trains in before
        (runner._precision_for_device)."""
        if not self.adj.replan:
            return cfg, ""
        notes = [precision_note] if precision_note else []
        if precision_note:
            self.precision_override = cfg.training.precision
        split, why = fit_micro_batch(cfg, spec, device, self.world, machine_profile())
        if split != Split.of(cfg):
            notes.append(f"{Split.of(cfg).describe()} -> {split.describe()} ({why})")
            cfg = with_split(cfg, split)
        elif why:
            notes.append(why)
        lost = self.adj.replan
        reason = f"continued on {device} after a device failure in step {(lost.get('step') or 0) + 1}" + (
            f": {'; '.join(notes)}" if notes else "")
        self.adj.history.append({"time": time.time(), "kind": "device_replan", "step": lost.get("step"),
                                 "reason": reason, "device": device, "lost_device": lost.get("lost_device"),
                                 "to": {**Split.of(cfg).as_dict(), "precision": cfg.training.precision}})
        self.adj.replan = None
        if self.rank == 0:
            self._store(self.adj, cfg)
            self.record_event("device_replan", lost.get("step"), reason, device=device,
                        to={**Split.of(cfg).as_dict(), "precision": cfg.training.precision})
        self.say(f"recovery: {reason}")
        self.cfg = cfg
        return cfg, reason

    def _store(self, adj: Adjustments, cfg: "RunConfig") -> None:
        t = cfg.training
        adj.training = {"micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
                        "grad_checkpointing": t.grad_checkpointing}
        if self.precision_override is not None:  # only a precision a recovery chose is pinned
            adj.training["precision"] = self.precision_override
        adj.processes = adj.processes or self.world
        adj.global_batch = adj.global_batch or t.micro_batch * t.grad_accum * self.world
        save_adjustments(self.run_dir, adj)

    def record_event(self, kind: str, step: int | None, reason: str, **details: Any) -> None:
        append_record(self.metrics, event(kind, step, reason, **details))

    # -- requests from other threads ---------------------------------------------------------
    def request(self, what: str, reason: str) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            self._requests.setdefault(what, reason)
        return True

    def take_requests(self) -> dict[str, str]:
        with self._lock:
            out, self._requests = self._requests, {}
        return out

    # -- per attempt ---------------------------------------------------------------------------
    def attach(self, trainer, cfg: "RunConfig") -> None:
        self.trainer, self.cfg = trainer, cfg
        self.attempts += 1
        self.take_requests()  # made while the last attempt wound up: about the split just replaced
        self.pending = None
        self.fallback_from = None
        self.policy.reset()
        self.phase = "boundary"
        trainer._tf_block_saves = False

    def classify(self, exc: BaseException) -> Failure | None:
        return classify(exc) if self.enabled else None

    def after_attempt(self, trainer, failure: Failure | None) -> Attempt | Relaunch | None:
        """What to do once trainer.train() returned (failure None) or failed with `failure`."""
        if failure is not None:
            self._end_callbacks(trainer, failure)
            if failure.kind == "oom":
                return self._after_oom(trainer, failure)
            if failure.kind == "device_lost":
                return self._after_device_failure(trainer, failure)
            return self._fallback(trainer, f"a non-finite loss raised {failure.describe()}",
                                  checkpoint_step(latest_checkpoint(self.ckpt_dir)), failure.describe())
        if self.pending is None:
            return None
        what, reason, step = self.pending
        if what == "fallback":
            return self._fallback(trainer, reason, self.fallback_from if self.fallback_from is not None else step,
                                  reason)
        kind = "memory_pressure"
        if what == "amp":
            kind, cfg = "amp_fallback", self._amp_config()
            reason = f"{reason}: the smallest split already; precision {self.cfg.training.precision} -> " \
                     f"{cfg.training.precision} (16-bit activations)"
        else:
            new = shrink(Split.of(self.cfg))
            if new is None:
                return None
            cfg = with_split(self.cfg, new)
        if self._finished(trainer):  # the last step: nothing left to compute with it, a --resume will
            self._record(kind, step, reason, self.cfg, cfg, trainer)
            return None
        checkpoint = self.checkpoint_now(trainer)
        self._record(kind, step, reason, self.cfg, cfg, trainer)
        return Attempt(cfg, checkpoint, kind, reason)

    def amp_step_down(self) -> str | None:
        """The 16-bit precision an out-of-memory run steps down to, where the device has one; None
        after a non-finite fallback went the other way (no back and forth)."""
        if any(h.get("kind") == "precision_fallback" for h in self.adj.history):
            return None
        return memory_precision(self.cfg.training.precision, supported_precisions(self.device), self.device)

    def _amp_config(self) -> "RunConfig":
        new = self.amp_step_down()
        self.precision_override = new
        return with_training(self.cfg, precision=new)

    def _finished(self, trainer) -> bool:
        s = trainer.state
        return bool(s.max_steps and s.global_step >= s.max_steps) or (
            self.stop_after is not None and s.global_step >= self.stop_after)

    def _end_callbacks(self, trainer, failure: Failure) -> None:
        """A train() that raised never told its callbacks that it ended (progress bars, the
        monitor's thread): do it, so every attempt is one on_train_begin .. on_train_end."""
        try:
            trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        except Exception as exc:  # noqa: BLE001  (a callback's problem must not hide the failure)
            self.log(f"recovery: a callback failed while the attempt was wound up: {type(exc).__name__}: {exc}")

    # -- out of memory ---------------------------------------------------------------------------
    def _after_oom(self, trainer, failure: Failure) -> Attempt:
        step = trainer.state.global_step
        current = Split.of(self.cfg)
        new = shrink(current)
        if self.world > 1:
            self._ask_for_restart(failure, step, current, new)
        trusted = self.phase != "optimizer"
        try:
            trainer.model.zero_grad(set_to_none=True)  # the partial gradients of the failed step
        except Exception:
            pass
        free_device_memory()
        checkpoint = self.checkpoint_now(trainer) if trusted else latest_checkpoint(self.ckpt_dir)  # (one process here)
        resumed_at = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if resumed_at < step:  # the steps after the checkpoint are trained again: their records go
            trim_steps_after(self.run_dir, resumed_at)
        if new is None and self.amp_step_down() is not None:  # one process: world > 1 asked for a restart above
            cfg = self._amp_config()
            reason = (f"out of memory in step {step + 1} ({failure.backend}) with {current.describe()}, the smallest "
                      f"split: precision {self.cfg.training.precision} -> {cfg.training.precision} (16-bit "
                      "activations), global batch kept")
            self._record("amp_fallback", step, reason, self.cfg, cfg, trainer, backend=failure.backend,
                         message=failure.message, continued_from=Path(checkpoint).name if checkpoint else "start",
                         replayed=not trusted)
            self.say(f"recovery: {reason}; continuing from {Path(checkpoint).name if checkpoint else 'the start'}")
            return Attempt(cfg, checkpoint, "amp_fallback", reason)
        if new is None:
            where = f"; the last complete checkpoint is {Path(checkpoint).name}" if checkpoint else ""
            raise DoesNotFitError(
                f"out of memory in step {step + 1} ({failure.backend}) with {current.describe()}: micro-batch 1 "
                f"with gradient checkpointing is the smallest step trainfit can make{where}",
                hint="use a smaller model, a shorter training.seq_len, LoRA/QLoRA, or a device with more memory; "
                     "`trainfit plan` finds a setting that fits")
        cfg = with_split(self.cfg, new)
        reason = (f"out of memory in step {step + 1} ({failure.backend}): {current.describe()} -> {new.describe()}, "
                  f"global batch kept")
        self._record("oom_recovered", step, reason, self.cfg, cfg, trainer, backend=failure.backend,
                     message=failure.message, continued_from=Path(checkpoint).name if checkpoint else "start",
                     replayed=not trusted)
        self.say(f"recovery: {reason}; continuing from {Path(checkpoint).name if checkpoint else 'the start'}")
        return Attempt(cfg, checkpoint, "oom_recovered", reason)

    def _ask_for_restart(self, failure: Failure, step: int, current: Split, new: Split | None) -> None:
        """Several processes: record what this rank needs and stop; torchrun restarts every rank."""
        if new is None:
            raise DoesNotFitError(f"out of memory on rank {self.rank} in step {step + 1} ({failure.backend}) with "
                                  f"{current.describe()}: nothing smaller to try",
                                  hint="use a smaller model, a shorter seq_len, LoRA/QLoRA or more memory per GPU")
        t = self.cfg.training
        reason = (f"out of memory on rank {self.rank} in step {step + 1} ({failure.backend}): {current.describe()} -> "
                  f"{new.describe()} on every rank, global batch kept")
        write_request(self.run_dir, self.rank, {
            "config_hash": self.config_hash, "time": time.time(), "kind": "oom", "event": "oom_recovered",
            "rank": self.rank, "step": step, "reason": reason, "backend": failure.backend, "message": failure.message,
            "from": current.as_dict(), "to": new.as_dict(), "processes": self.adj.processes or self.world,
            "global_batch": self.adj.global_batch or t.micro_batch * t.grad_accum * self.world})
        raise DoesNotFitError(f"{reason}; all ranks must restart with it (recorded in RUN_DIR/{REQUEST_DIR})",
                              hint="under `torchrun --max-restarts N` the ranks restart and continue by themselves; "
                                   "otherwise run the same command again with --resume")

    # -- non-finite losses ---------------------------------------------------------------------
    def _fallback(self, trainer, reason: str, good_step: int, detail: str) -> Attempt:
        current = self.cfg.training.precision
        supported = supported_precisions(self.device)
        new = next_precision(current, supported)
        checkpoint = self._bcast(complete_checkpoint(self.ckpt_dir, good_step) if self.rank == 0 else None)
        raised = sum(1 for h in self.adj.history if h.get("kind") == "accumulation_raised")
        if new is None and raised >= MAX_ACCUMULATION_RAISES:
            where = f"; the last good state is {Path(checkpoint).name}" if checkpoint else ""
            raise TrainingDivergedError(
                f"training diverged: {reason}, in fp32 and with the accumulation raised {raised} time(s) already; "
                f"nothing left to try{where}",
                hint="lower schedule.lr, raise warmup_steps or check the data; --resume continues from the last good "
                     "checkpoint")
        if new is None:  # fp32 already: a larger effective batch averages the noisy gradients out
            cfg = with_training(self.cfg, grad_accum=self.cfg.training.grad_accum * 2)
            kind, change = "accumulation_raised", (f"gradient accumulation {self.cfg.training.grad_accum} -> "
                                                    f"{cfg.training.grad_accum} (global batch x2)")
        else:
            cfg = with_training(self.cfg, precision=new)
            self.precision_override = new
            kind, change = "precision_fallback", f"precision {current} -> {new}"
        if checkpoint is None and good_step > 0 and good_step == trainer.state.global_step and self.phase != "optimizer":
            checkpoint = self.checkpoint_now(trainer)  # asked for at a boundary: this step is good
        if checkpoint is None and good_step > 0:  # the save at the streak's start failed: an earlier one
            checkpoint = self._bcast(latest_checkpoint(self.ckpt_dir, at_most=good_step) if self.rank == 0 else None)
        good_step = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if self.rank == 0:
            dropped = remove_newer_checkpoints(self.ckpt_dir, good_step, self.say)
            trim_steps_after(self.run_dir, good_step)
        else:
            dropped = []
        if self.world > 1:
            trainer.accelerator.wait_for_everyone()
        full = (f"{reason}: {change}, continuing from the last good step {good_step} "
                f"(steps after it are trained again)")
        if kind == "accumulation_raised":
            t = cfg.training
            self.adj.global_batch = t.micro_batch * t.grad_accum * self.world  # on purpose: a larger batch
        self._record(kind, good_step, full, self.cfg, cfg, trainer, detail=detail,
                     continued_from=Path(checkpoint).name if checkpoint else "start",
                     abandoned_checkpoints=[p.name for p in dropped])
        self.say(f"recovery: {full}")
        return Attempt(cfg, checkpoint, kind, full)

    # -- device failure ----------------------------------------------------------------------------
    def _after_device_failure(self, trainer, failure: Failure) -> Relaunch:
        step = trainer.state.global_step
        lost = current_device_name(self.device)
        latest = latest_checkpoint(self.ckpt_dir)
        where = Path(latest).name if latest else "the start"
        reason = (f"{failure.describe()} in step {step + 1} on {lost}: the in-memory state is not trusted; the run "
                  f"continues from {where} in a fresh process")
        if self.world > 1:
            reason = (f"{failure.describe()} in step {step + 1} on {lost}: the in-memory state is not trusted; the "
                      f"run continues from {where} when launched again with --resume")
            t = self.cfg.training
            write_request(self.run_dir, self.rank, {
                "config_hash": self.config_hash, "time": time.time(), "kind": "device_lost", "event": "device_lost",
                "rank": self.rank, "step": step, "reason": reason, "device": lost, "backend": failure.backend,
                "processes": self.adj.processes or self.world,
                "global_batch": self.adj.global_batch or t.micro_batch * t.grad_accum * self.world})
            raise UnavailableError(f"rank {self.rank}: {reason}",
                                   hint="launch on the remaining devices (fewer processes are fine: the global batch "
                                        "is kept by raising grad_accum)")
        self.record_event("device_lost", step, reason, device=lost, backend=failure.backend, message=failure.message,
                    continued_from=Path(latest).name if latest else "start")
        self.adj.replan = {"reason": reason, "step": step, "lost_device": lost}
        self.adj.history.append({"time": time.time(), "kind": "device_lost", "step": step, "reason": reason,
                                 "device": lost, "backend": failure.backend})
        self._store(self.adj, self.cfg)
        self.say(f"recovery: {reason}")
        return Relaunch(failure, step)

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoint_now(self, trainer) -> str | None:
        """The checkpoint of the last completed step (written now unless it exists): what a periodic
        save at that step writes, RNG states included (from the step-end snapshot)."""
        step = trainer.state.global_step
        if step == 0:
            return None
        existing = self._bcast(complete_checkpoint(self.ckpt_dir, step) if self.rank == 0 else None)
        if existing:
            return existing
        snap = self.snapshot[1] if self.snapshot and self.snapshot[0] == step else None
        now = rng_snapshot() if snap else None
        try:
            rng_restore(snap)
            trainer._tf_force_save = True
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
            if step in getattr(trainer, "_tf_refused_saves", ()):  # non-finite parameters: not a good state
                latest = self._bcast(latest_checkpoint(self.ckpt_dir) if self.rank == 0 else None)
                self.say(f"recovery: the state of step {step} has non-finite parameters; continuing from "
                         f"{Path(latest).name if latest else 'the start'} instead")
                return latest
            trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        except Exception as exc:  # noqa: BLE001  (e.g. out of memory again while saving, a full disk)
            if self.world > 1:
                raise
            latest = latest_checkpoint(self.ckpt_dir)
            self.say(f"recovery: could not save step {step} ({type(exc).__name__}: {exc}); continuing from "
                     f"{Path(latest).name if latest else 'the start'} instead (resume is exact: the steps since "
                     "are trained again)")
            return latest
        finally:
            trainer._tf_force_save = False
            rng_restore(now)
        return str(self.ckpt_dir / f"checkpoint-{step}")

    def _bcast(self, value):
        if self.world <= 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box)
        return box[0]

    def _record(self, kind: str, step: int, reason: str, before: "RunConfig", after: "RunConfig", trainer,
                **details: Any) -> None:
        frm = {**Split.of(before).as_dict(), "precision": before.training.precision}
        to = {**Split.of(after).as_dict(), "precision": after.training.precision}
        t = after.training
        self.adj.processes = self.adj.processes or self.world
        self.adj.global_batch = self.adj.global_batch or t.micro_batch * t.grad_accum * self.world
        entry = {"time": time.time(), "kind": kind, "step": step, "reason": reason, "rank": self.rank,
                 "from": frm, "to": to, **details}
        self.adj.history.append(entry)
        if self.rank == 0:
            self._store(self.adj, after)
            self.record_event(kind, step, reason, **{k: v for k, v in entry.items()
                                               if k not in ("time", "kind", "step", "reason")},
                        global_batch=self.adj.global_batch)

    # -- relaunch --------------------------------------------------------------------------------
    def relaunch(self, relaunch: Relaunch, *, stop_after: int | None, quiet: bool, faults_plan) -> dict[str, Any]:
        """Run the rest of the training in a fresh process on the remaining devices; its summary."""
        return relaunch_in_fresh_process(self.run_dir, self.device, stop_after=stop_after, quiet=quiet,
                                         faults_plan=faults_plan, say=self.say, before_start=self.close)
