"""Automatic recovery inside `trainfit train`: the run goes on, with the same maths, after an
out-of-memory error, memory pressure, a streak of non-finite losses or a failed device.

What changes and what does not
------------------------------
The global batch (micro_batch x grad_accum x processes), the data order, the optimizer step count
and the LR schedule never change (but for the accumulation raised after an fp32 non-finite
streak, below). What may change is how a step is computed:

* out of memory: the micro-batch is split (halved: its largest divisor <= half) and the gradient
  accumulation multiplied by the same factor; at micro-batch 1 gradient checkpointing is turned on;
  with both done already an fp32 run steps down to 16-bit autocast (bf16-mixed, or fp16-mixed on a
  GPU without bf16: "AMP fallback on OOM", one process); with that done too the run stops with
  DoesNotFitError (exit 3), its progress checkpointed.
* memory pressure (`request_shrink(reason)`, from safety.MemoryPressurePolicy): the same split (or
  the same 16-bit step down), at the next optimizer-step boundary, before anything fails.
* non-finite losses or gradients (PrecisionPolicy; the gradient norm the Trainer computes is
  checked before each update, since NaN gradients can come with a finite loss): the step's update
  is skipped (its gradients are dropped, as a GradScaler skips an fp16 overflow step); a streak of
  them (3) or a collapsed fp16 loss scale switches the precision fp16 -> bf16 (where the device
  has it, core/plan/hardware_rules) -> fp32 and continues from the last good step (the steps of the
  streak are trained again). A streak in fp32 doubles the gradient accumulation once ("gradient
  accumulation adjustment for stability": the one recovery that changes the global batch, on
  purpose, recorded in adjustments.json); a streak after that is divergence:
  TrainingDivergedError (exit 5). No checkpoint is written of non-finite parameters
  (trainer_ext), so "the last good step" is always finite.
* a failed device (lost, ECC, poisoned CUDA context): the in-memory state is not trusted; the run
  continues from its last complete checkpoint in a FRESH process (`python -m trainfit.cli.main train
  RUN_DIR/config.yaml --out RUN_DIR --resume`) with CUDA_VISIBLE_DEVICES narrowed to the remaining
  GPUs (empty: the CPU), re-planned for the device it lands on (precision, micro-batch checked with
  the memory model under the safety mode's memory share).

How a recovery continues the same run (one process)
---------------------------------------------------
An OOM happens in the middle of optimizer step s+1; the weights, optimizer, scheduler, step count
and data position are still those of step s (only partial gradients exist; they are dropped). The
state of step s is saved through the Trainer's own checkpoint writer (`_save_checkpoint`: atomic,
with manifest), with the RNG states as they were at the end of step s (snapshotted at every step
end), i.e. exactly the checkpoint a periodic save at step s writes. A new Trainer with the new
split resumes from it through `resume_from_checkpoint`: Transformers skips steps x grad_accum
micro-batches of the same seeded sampler, which with micro_batch/k x grad_accum*k are exactly the
samples of the first s steps; each later step trains on the same samples as before (tested by
sample digests, tests/train/test_recovery.py; bench/oom_recovery.py). An OOM inside the optimizer
update itself (the state may be half updated) continues from the last complete checkpoint instead:
resume is exact, so the steps since then are trained again to the same values.

Several processes
-----------------
An OOM on one rank leaves the others inside a collective, which no Python code can leave safely.
So the failing rank records the request (RUN_DIR/.recovery/request-rank<N>.json) and exits with
exit code 3; torchrun stops every rank (it always does when one fails) and, when launched with
`--max-restarts`, starts them again. Every restarted rank reads the requests, they agree (all_gather)
on the split, continue from the last complete checkpoint with it, and rank 0 folds the requests into
adjustments.json. Without `--max-restarts`, running the same command with --resume does the same.
Requests made at a step boundary (request_shrink, the non-finite check) need no restart: the ranks
all-reduce their flags once per optimizer step, before the update, and shrink or fall back together.
A failed device under torchrun is recorded the same way and stops the job (exit code 4): launched
again on the remaining devices with --resume, the global batch is split over the new number of
processes (grad_accum raised). A restarted worker group initialises its process group on store
keys of its own attempt (init_restarted_process_group: torchrun keeps the old ranks' addresses).

What is recorded
----------------
RUN_DIR/adjustments.json (written atomically, rank 0): the split and precision in force, the
global batch and the process count it was planned for, and the history of recoveries; a later
--resume applies it. Every recovery is an event in metrics.jsonl (train/monitor/events.py) with its reason,
and summary.json carries the split in force and the history. config.sha256 hashes the global batch,
not its split (RunConfig.config_hash), so the adjusted run still resumes.

Where it lives
--------------
split.py        Split (micro-batch x accumulation, checkpointing), shrink, split_for_world, fit_micro_batch
precision.py    the precision fallback order, the AMP step down on OOM, PrecisionPolicy (non-finite streaks)
adjustments.py  adjustments.json and the requests failed ranks leave in RUN_DIR/.recovery
session.py      RecoverySession (what happens after each train() attempt), request_shrink,
                request_precision_fallback
callback.py     RecoveryCallback: the session's step-boundary checks inside the training loop
rollback.py     going back to an earlier step: RNG states, the run's checkpoints, metrics.jsonl trimmed
restart.py      a fresh process after a device failure; a worker group torchrun started again
oom.py          classify(exc): out of memory, a failed device, a raised non-finite loss
faults.py       fault injection for tests and benchmarks (TRAINFIT_FAULTS, a scripted machine)
checkpoints.py  checkpoint manifests, verification, retention
"""
