"""Run one training from a RunConfig: pretrain, SFT (full / LoRA / QLoRA) or DPO.

Built on Transformers' Trainer and TRL's SFTTrainer / DPOTrainer (so resume, DDP, FSDP and
DeepSpeed are the libraries' tested code paths); trainfit adds the run directory, atomic
checkpoints, metrics, progress and predicted-vs-measured figures.

Run directory:
    config.yaml        the resolved config        config.sha256   its hash (see RunConfig.config_hash)
    adjustments.json   (after an automatic recovery) the split / precision in force and their history
    tokenizer/         the tokenizer used (trained here when none was given)
    checkpoints/       checkpoint-<step> (complete, with manifest), at most keep_last of them
    metrics.jsonl      one line per logged step      summary.json  the result
    final/             the trained model (or adapter) and tokenizer
    random-init/       (qlora with random weights) the initial weights, saved to be loaded quantized

tokenizer/, final/ and random-init/ are written into a hidden temporary sibling and renamed into
place (trainfit.files.atomic_dir), so each is complete or absent. A run that fails before its first
checkpoint removes what it created (the whole run directory when it created it), so the same
--out can be used again; a resume that cannot load its checkpoint changes nothing.

Recovery (trainfit.train.recovery): an out-of-memory error, memory pressure, a streak of non-finite
losses or a failed device do not end the run; it goes on with the same global batch, data order,
step count and schedule (a smaller micro-batch with more accumulation, another precision, a fresh
process on the remaining devices). Each train() call of the loop in `_train` is one attempt; the
callbacks see on_train_begin .. on_train_end once per attempt (also when an attempt failed).

The config in force (trainfit.train.in_force.InForce) starts as the user's and changes only
through InForce.change: precision auto for the device, the recorded adjustments, a re-plan after a
device failure, data keys this machine cannot honour, each recovery; every change is a
`config_change` event in metrics.jsonl (the fields old -> new, and why).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainfit.config.run_config import RunConfig
from trainfit.errors import BadInputError, DoesNotFitError, TrainfitError, require_extra
from trainfit.export.engine import sharding_engine
from trainfit.export.training_args import trainer_config, training_arguments
from trainfit.train.environment import resolve_device, world
from trainfit.train.in_force import InForce
from trainfit.train.recovery import checkpoints as ck
from trainfit.train.run_dir import FailedStartCleanup, finished_summary, prepare_run_dir, trim_metrics, write_run_files
from trainfit.train.run_summary import build_summary, logged_losses, plan_details
from trainfit.train.trainer_setup import build_dataset, check_method_available, get_tokenizer, make_model, make_trainer
from trainfit.versions import transformers_major

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    global_step: int
    losses: list[tuple[int, float]]  # (step, loss) of this invocation's logged steps
    summary: dict[str, Any]
    resumed_from: str | None = None
    step_seconds: list[float] = field(default_factory=list)


def run_training(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
                 quiet: bool = False, log: Log | None = None, extra_callbacks: list | None = None,
                 write_summary: bool = True, recover: bool = True) -> RunResult:
    """Train; the Python twin of `trainfit train`. `stop_after` stops (with a checkpoint) after
    that many optimizer steps without changing the schedule, so --resume continues the same run.
    `recover` (default on): recover from out-of-memory errors, non-finite losses and device
    failures (trainfit.train.recovery); off: such a failure ends the run as it is.

    When it fails before writing a checkpoint, what it created in run_dir is removed again (the
    whole directory when it created it), so the same run_dir can be used for the next try."""
    require_extra("torch", "train")
    require_extra("trl", "train")
    from trainfit.train.recovery.adjustments import (ADJUSTMENTS, Adjustments, apply_adjustments, load_adjustments,
                                                     restart_pending)

    rank, world_size = world()
    log = log or (lambda m: None)
    say = log if rank == 0 else (lambda m: None)
    from trainfit.config.run_config import shared_storage_errors

    for problem in shared_storage_errors(cfg, str(run_dir)):  # before anything is read or written
        raise BadInputError(problem)
    run_dir = Path(run_dir).resolve()
    user_cfg = cfg
    requests = _recovery_requests(run_dir, user_cfg) if recover else []
    if requests and not resume and restart_pending(run_dir, requests[0]["config_hash"]):
        say(f"continuing {run_dir.name} after a restart one of its processes asked for "
            f"({requests[0].get('reason', 'recovery')})")
        resume = True
    if not resume:
        requests = []
    adj = load_adjustments(run_dir) if resume and recover else Adjustments()
    processes = adj.processes or (requests[0].get("processes") if requests else None) or world_size
    replan = bool(adj.replan) or any(r.get("kind") == "device_lost" for r in requests)
    # after a device failure the run lands wherever it can: an explicit device: cuda may be gone
    device = resolve_device(_with_device(user_cfg, "auto") if replan else user_cfg)
    from trainfit.train.predictions import hardware_profile

    in_force = InForce(user_cfg)
    hardware = hardware_profile() if user_cfg.training.precision == "auto" else None
    resolved = in_force.change(user_cfg.for_device(device, hardware), f"precision auto made concrete for {device}",
                               source="device")
    in_force.change(apply_adjustments(resolved, adj, world_size),
                    f"the split and precision earlier recoveries chose (RUN_DIR/{ADJUSTMENTS}), the "
                    f"global batch kept over {world_size} process(es)", source="adjustments")
    precision_note = None
    if replan:
        fitted, precision_note = _precision_for_device(in_force.cfg, device)
        in_force.change(fitted, f"after a device failure: {precision_note}", source="device_failure")
    check_method_available(in_force.cfg, device)
    from trainfit.train.data import cache_additions, check_cache_dir

    check_cache_dir(in_force.cfg)  # before anything is written or read
    resume_from = prepare_run_dir(user_cfg, run_dir, resume, say, processes=processes, legacy=resolved)
    finished = finished_summary(run_dir, resume_from)
    if finished is not None:
        say(f"{run_dir.name} already finished: step {finished['global_step']} of {finished['max_steps']}; "
            "nothing to train")
        return RunResult(run_dir, finished["global_step"], [], finished, resumed_from=resume_from.path.name)
    undo = FailedStartCleanup(run_dir, cache_additions(in_force.cfg.data.cache_dir, run_dir)) if rank == 0 else None
    start = _Start(run_dir, device, resume_from, adj, requests, processes, precision_note)
    asked = _Asked(stop_after, quiet, say, log, extra_callbacks, write_summary, recover)
    try:
        return _train(in_force, start, asked)
    except BaseException:
        if undo is not None:
            undo(say)
        raise


@dataclass(frozen=True)
class _Start:
    """What run_training found out about this start: where the run lands and what it continues."""

    run_dir: Path
    device: str
    resume_from: ck.CheckpointInfo | None
    adj: Any  # recovery.adjustments.Adjustments read from RUN_DIR/adjustments.json
    requests: list  # what failed ranks recorded for this restart (recovery.adjustments.read_requests)
    processes: int  # processes the global batch was planned for
    precision_note: str | None  # after a device failure: the precision changed for the new device

    @property
    def resume_step(self) -> int | None:
        return self.resume_from.step if self.resume_from else None


@dataclass(frozen=True)
class _Asked:
    """What the caller of run_training asked for (its keyword arguments)."""

    stop_after: int | None
    quiet: bool
    say: Log  # messages for the user (rank 0 only)
    log: Log  # every rank's messages
    extra_callbacks: list | None
    write_summary: bool
    recover: bool


def _with_device(cfg: RunConfig, device: str) -> RunConfig:
    import dataclasses

    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, device=device))


def _recovery_requests(run_dir: Path, user_cfg: RunConfig) -> list[dict[str, Any]]:
    """Requests failed ranks of this run (this config) recorded for the next start."""
    from trainfit.train.recovery.adjustments import read_requests

    out = []
    for req in read_requests(run_dir):
        n = req.get("processes")
        if isinstance(n, int) and n >= 1 and req.get("config_hash") == user_cfg.config_hash(n):
            out.append(req)
    return out


def _precision_for_device(cfg: RunConfig, device: str) -> tuple[RunConfig, str | None]:
    """After a device failure: the config's precision, or the next one down (fp16 -> bf16 -> fp32)
    the device the run landed on trains in."""
    import dataclasses

    from trainfit.train.recovery.precision import next_precision, supported_precisions

    precision = cfg.training.precision
    supported = supported_precisions(device)
    if (supported is None or precision in supported) and not (device == "cpu" and precision.startswith("fp16")):
        return cfg, None
    new = next_precision(precision, supported) or "fp32"
    note = f"precision {precision} -> {new} ({device} does not train in {precision})"
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, precision=new)), note


def _train(in_force: InForce, start: _Start, asked: _Asked) -> RunResult:
    from trainfit.train.recovery import faults
    from trainfit.train.recovery.adjustments import read_requests
    from trainfit.train.recovery.oom import free_device_memory
    from trainfit.train.recovery.restart import Relaunch
    from trainfit.train.recovery.session import RecoverySession

    run_dir, device, resume_from, stop_after = start.run_dir, start.device, start.resume_from, asked.stop_after
    say, log, recover = asked.say, asked.log, asked.recover
    rank, world_size = world()
    # TRAINFIT_FAKE_MACHINE: a scripted machine for the monitor instead of this one (tests, demos);
    # read first, so a bad script is refused before any work
    fake_machine = faults.fake_machine_from_env(lambda: monitor.monitor.current_step)
    ckpt_dir = run_dir / "checkpoints"
    arg_inputs = dict(device=device, output_dir=str(ckpt_dir), world_size=world_size,
                      transformers_major=transformers_major())
    probe_args = _probe_arguments(in_force.cfg, device, world_size, arg_inputs)
    resume_step = start.resume_step
    if rank == 0:
        write_run_files(in_force.user, run_dir, resume_step, processes=start.processes)
    probe_args.distributed_state.wait_for_everyone()
    session = RecoverySession(run_dir, in_force.user, device=device, rank=rank, world_size=world_size,
                              say=say, log=log, config_hash=in_force.user.config_hash(start.processes),
                              stop_after=stop_after, enabled=recover)
    try:
        in_force.change(session.start(in_force.cfg, start.adj, start.requests, probe_args.distributed_state),
                        _restart_reason(start.requests), source="restart_requests")
        if resume_from:
            say(f"resuming from {resume_from.path.name} (step {resume_from.step})")
        tokenizer, tok_note = get_tokenizer(in_force.cfg, run_dir, probe_args, say)
        dataset = build_dataset(in_force, tokenizer, probe_args, say)
        watch = _watch(in_force, start, asked, session, fake_machine, tokens_fn=lambda: trainer.tokens_seen())
        timer, writer, plan, monitor, fault_plan = watch.timer, watch.writer, watch.plan, watch.monitor, watch.fault_plan
        checkpoint = str(resume_from.path) if resume_from else None
        started = time.perf_counter()

        def replan(spec) -> None:  # after a device failure: the split for the device the run landed on
            if session.adj.replan:
                cfg, reason = session.replan_for_device(in_force.cfg, spec, device, start.precision_note)
                in_force.change(cfg, reason, source="device_replan", step=resume_step)

        while True:
            model, ref, built = _build(in_force, tokenizer, dataset, run_dir, say, probe_args, watch.callbacks,
                                       ckpt_dir, arg_inputs, recover, replan)
            trainer = built.trainer
            plan.details = plan_details(built, in_force.cfg, device, world_size, stop_after)
            if monitor.monitor.predicted_peak_bytes is None:
                monitor.monitor.predicted_peak_bytes = plan.details["predicted"].get("total_bytes")
            if built.weights.startswith("random") and session.attempts == 0:
                say("weights: RANDOM initialisation (not a pretrained model)")
            session.attach(trainer, in_force.cfg)
            failure = None
            try:
                trainer.train(resume_from_checkpoint=checkpoint)
            except BaseException as exc:
                failure = session.classify(exc)
                if failure is None:
                    if world_size > 1 and recover and isinstance(exc, Exception) and read_requests(run_dir):
                        # a collective broke because another rank stopped to ask for a restart
                        raise TrainfitError(f"rank {rank} stopped: another rank asked every rank to restart with a "
                                            f"new split ({type(exc).__name__}: {str(exc)[:120]})") from None
                    raise
            # (the exception and the frames it held, activations included, are released here)
            nxt = session.after_attempt(trainer, failure)
            if nxt is None:
                break
            _release(trainer)
            del trainer, model, ref, built
            free_device_memory()
            if isinstance(nxt, Relaunch):
                summary = session.relaunch(nxt, stop_after=stop_after, quiet=asked.quiet, faults_plan=fault_plan)
                return RunResult(run_dir, summary["global_step"], logged_losses(run_dir), summary,
                                 str(resume_from.path) if resume_from else None, list(timer.step_seconds))
            in_force.change(nxt.cfg, nxt.reason, source=nxt.kind, step=_checkpoint_step(nxt.checkpoint))
            checkpoint = nxt.checkpoint
        wall = time.perf_counter() - started
        return _finish(in_force, start, asked, session, watch, built, tokenizer, tok_note, wall)
    finally:
        session.close()


def _probe_arguments(cfg: RunConfig, device: str, world_size: int, arg_inputs: dict):
    """The run's TrainingArguments, made once before any attempt: making them initialises the
    process group under a launcher (after a torchrun restart, on store keys of this attempt)."""
    from transformers import TrainingArguments

    from trainfit.train.recovery.restart import init_restarted_process_group

    if world_size > 1 and sharding_engine(cfg) is None and device in ("cuda", "cpu"):
        backend = cfg.distributed.backend if cfg.distributed.backend != "auto" else (
            "nccl" if device == "cuda" else "gloo")
        init_restarted_process_group(backend)  # after a torchrun restart only
    # initialises the process group under a launcher
    return TrainingArguments(**training_arguments(cfg, **arg_inputs))


def _finish(in_force: InForce, start: _Start, asked: _Asked, session, watch: _Watch, built: _Built, tokenizer,
            tok_note: str, wall: float) -> RunResult:
    """After the last attempt: the final model (rank 0), summary.json, the result."""
    from trainfit.files import atomic_dir
    from trainfit.train.callbacks import device_memory

    rank, world_size = world()
    run_dir, resume_from, trainer = start.run_dir, start.resume_from, built.trainer
    timer, writer = watch.timer, watch.writer
    losses = sorted({r["step"]: r["loss"] for r in writer.records}.items())  # steps trained again: the last
    summary: dict[str, Any] = {}
    if rank == 0:
        with atomic_dir(run_dir / "final", replace=True) as final:
            trainer.save_model(str(final))
            tokenizer.save_pretrained(str(final))
        summary = build_summary(in_force.cfg, built, trainer, timer, writer, start.device, world_size, wall,
                                resume_from, tok_note, device_memory(), session, in_force.changes)
        if asked.write_summary:
            from trainfit.files import write_atomic

            write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    trainer.accelerator.wait_for_everyone()
    return RunResult(run_dir, trainer.state.global_step, losses, summary,
                     str(resume_from.path) if resume_from else None, list(timer.step_seconds))


@dataclass(frozen=True)
class _Watch:
    """The callbacks every attempt gets, and those of them the runner reads back."""

    callbacks: list
    timer: Any  # callbacks.StepTimer
    writer: Any  # callbacks.MetricsWriter
    plan: Any  # callbacks.RunPlan
    monitor: Any  # monitor.MonitorCallback
    fault_plan: Any  # faults.FaultPlan or None


def _watch(in_force: InForce, start: _Start, asked: _Asked, session, fake_machine, tokens_fn) -> _Watch:
    """Step timing, metrics.jsonl, progress, the live monitor, the safety policies, injected faults
    and the recovery callback (last: it stops an attempt at a boundary)."""
    from trainfit.train.recovery import faults
    from trainfit.train.callbacks import BeforeFirstStep, MetricsWriter, Progress, RunPlan, StepTimer, StopAt

    rank, world_size = world()
    run_dir, device, stop_after, resume_step = start.run_dir, start.device, asked.stop_after, start.resume_step
    say, log = asked.say, asked.log
    timer = StepTimer()
    metrics = run_dir / "metrics.jsonl" if rank == 0 else None
    writer = MetricsWriter(metrics, tokens_fn, timer, world_size, stop_step=stop_after)
    shown = in_force.cfg.logging.progress
    interactive = not asked.quiet and shown != "lines" and (shown == "bar" or os.isatty(2))
    progress = Progress("bar" if interactive else "lines",
                        f"{in_force.cfg.method} {in_force.cfg.name or ''}".strip(), writer, stop_step=stop_after)
    if not interactive:
        # Log-line mode: the libraries' own tqdm bars (e.g. "Writing model shards") would only add noise.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from trainfit.train.monitor.callback import build_monitor

    # The live monitor: machine samples into metrics.jsonl, leak warnings, the dashboard (main
    # process only; the predicted peak is filled in once the model is built).
    monitor = build_monitor(run_dir, settings=in_force.cfg.monitoring, total_steps=stop_after,
                            interactive=interactive, tokens_fn=tokens_fn, progress=progress,
                            shape=(in_force.cfg.training.micro_batch, in_force.cfg.training.seq_len), say=say,
                            **_fake_monitor_arguments(fake_machine))
    # metrics.jsonl is trimmed to the resumed trajectory only once the checkpoint has loaded; the
    # config changes made so far are written then too (a start that fails earlier writes nothing)
    trim = BeforeFirstStep((lambda: (trim_metrics(run_dir, resume_step), in_force.record_to(metrics)))
                           if rank == 0 else None)
    fault_plan = faults.from_env()
    injected = [faults.FaultInjector(fault_plan, rank, log)] if fault_plan is not None else []
    # The callbacks every attempt gets; extra_callbacks (monitor, safety policies) go before the
    # fault injector and the recovery callback, which stays last (it stops an attempt at a boundary).
    from trainfit.train.monitor.safety import safety_callbacks
    from trainfit.train.recovery.rollback import latest_checkpoint
    from trainfit.train.recovery.session import request_shrink

    # Thermal / battery pauses, memory pressure, checkpoint cadence and clean stops on SIGINT /
    # SIGTERM (core/run/safety_thresholds.py: thresholds of the config's safety.mode). The policies read
    # the monitor's latest sample each time they look (a function, not the sample of now).
    if monitor.enabled:
        sample_fn, leak_events = (lambda: monitor.monitor.latest_sample), monitor.monitor.events_since
    else:
        sample_fn = leak_events = None
        say("monitoring.enabled is false: no machine readings, so thermal, battery and memory-pressure "
            "protection are off for this run")
    safety = safety_callbacks(in_force.cfg.safety.mode, sample_fn, run_dir=run_dir, leak_events=leak_events,
                              interactive=interactive, log=say, device=device, world_size=world_size, rank=rank,
                              interruption_hours=in_force.cfg.safety.interruption_hours,
                              request_shrink=request_shrink, latest_checkpoint=latest_checkpoint,
                              **(fake_machine.safety_overrides if fake_machine is not None else {}))
    plan = RunPlan(metrics)
    callbacks = [trim, plan, timer, StopAt(stop_after), writer, progress, monitor] + \
        list(asked.extra_callbacks or []) + injected + safety + [session.callback]
    return _Watch(callbacks, timer, writer, plan, monitor, fault_plan)


def _restart_reason(requests: list[dict[str, Any]]) -> str:
    """Why RecoverySession.start changed the config: the failed ranks' requests, or (several
    processes) the ranks agreeing on one split."""
    asked = [r.get("reason") for r in requests if r.get("reason")]
    if asked:
        return "what failed ranks asked for before this restart: " + "; ".join(asked)
    return "every rank trains with the smallest split any rank computed"


def _checkpoint_step(checkpoint: str | None) -> int:
    """The step a checkpoint-<step> folder holds (0: no checkpoint, the start)."""
    return int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0


def _fake_monitor_arguments(machine) -> dict[str, Any]:
    """build_monitor's arguments for a scripted machine (trainfit.train.recovery.faults.FAKE_MACHINE_ENV)."""
    if machine is None:
        return {}
    from trainfit.train.monitor.leaks import LeakDetector

    spec = machine.spec
    out: dict[str, Any] = {"sampler": machine.sampler}
    if "interval_seconds" in spec:
        out["interval_seconds"] = float(spec["interval_seconds"])
    if "leak_detector" in spec:
        out["leak_detector"] = LeakDetector(**spec["leak_detector"])
    for key in ("leak_read_seconds", "leak_check_seconds"):
        if key in spec:
            out[key] = float(spec[key])
    if "memory_reading" in spec:
        out["memory_fn"] = machine.memory_reading
    return out


@dataclass
class _Built:
    """One attempt's Trainer and model description."""

    trainer: Any
    spec: Any
    spec_note: str
    weights: str


def _build(in_force: InForce, tokenizer, dataset, run_dir: Path, say: Log, probe_args, callbacks: list,
           ckpt_dir: Path, arg_inputs: dict, recover: bool, replan: Callable[[Any], None] = lambda spec: None):
    """The model (and DPO reference) and the Trainer of one attempt; `replan` may change the
    config in force once the model's description is known (after a device failure). Out of
    memory here (before a step ran) is not something a smaller micro-batch fixes: DoesNotFitError."""
    from trainfit.train.recovery.oom import classify

    try:
        model, ref, built = make_model(in_force.cfg, tokenizer, run_dir, say, probe_args)
        replan(built.spec)
        cfg = in_force.cfg
        trainer = make_trainer(cfg, model, ref, tokenizer, dataset, trainer_config(cfg, **arg_inputs), callbacks,
                               say, ckpt_dir)
    except BaseException as exc:
        failure = classify(exc) if recover else None
        if failure is None or failure.kind != "oom":
            raise
        raise DoesNotFitError(f"the model does not fit in memory before training starts: {failure.describe()}",
                              hint="use a smaller model, LoRA/QLoRA, or a device with more memory; `trainfit plan` "
                                   "finds a setting that fits") from None
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # it prints log dicts on stdout; ours go to stderr
    return model, ref, _Built(trainer, built.spec, built.spec_note, built.weights)


def _release(trainer) -> None:
    """Drop what an abandoned attempt's Trainer holds (model wrappers, optimizer state) so that the
    next attempt starts with the device's memory free."""
    try:
        trainer.accelerator.free_memory()
    except Exception:  # noqa: BLE001  (a failed device: nothing to free there)
        pass
    for name in ("model_wrapped", "optimizer", "lr_scheduler", "deepspeed"):
        if hasattr(trainer, name):
            try:
                setattr(trainer, name, None)
            except Exception:  # noqa: BLE001
                pass
