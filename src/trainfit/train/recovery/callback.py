"""RecoveryCallback: the recovery session's eyes inside the training loop (trainfit.train.recovery)."""

from __future__ import annotations

from transformers import TrainerCallback

from trainfit.train.recovery.rollback import rng_snapshot
from trainfit.train.recovery.split import Split, shrink


class RecoveryCallback(TrainerCallback):
    """The session's eyes inside the training loop: the phase of the step (is the in-memory state a
    whole step?), the RNG snapshot at every step end, the once-per-step agreement on non-finite
    losses and shrink / fallback requests, and stopping the attempt at a boundary when needed."""

    def __init__(self, session) -> None:  # the RecoverySession (recovery/session.py) it belongs to
        self.s = session

    def on_train_begin(self, args, state, control, **kw):
        self.s.phase = "boundary"

    def on_step_begin(self, args, state, control, **kw):
        self.s.phase = "compute"

    def on_pre_optimizer_step(self, args, state, control, **kw):
        s = self.s
        trainer = s.trainer
        if trainer is None or not s.enabled:
            return
        requests = s.take_requests()
        # NaN / inf gradients can come with a finite loss (an overflow in the backward pass): the
        # gradient norm the Trainer computed for this step is checked as well
        nonfinite, bad_grads = (trainer._tf_take_nonfinite() if hasattr(trainer, "_tf_take_nonfinite")
                                else (False, False))
        flags = [int(nonfinite or bad_grads), int("shrink" in requests), int("fallback" in requests),
                 int(nonfinite)]
        if s.world > 1:
            flags = _all_reduce_max(flags, trainer.args.device)
        reasons = requests
        step = state.global_step  # the last completed step (this one is not counted yet)
        if flags[0]:
            self._nonfinite(trainer, state, step, what="loss" if flags[3] else "gradient")
        else:
            s.policy.observe(step + 1, False)
        if s.pending is None and flags[2]:
            s.pending = ("fallback", reasons.get("fallback", "a precision fallback was requested on another rank"),
                         step)
            s.fallback_from = step
            trainer._tf_block_saves = True
        if s.pending is None and flags[1]:
            reason = reasons.get("shrink", "a shrink was requested on another rank")
            if shrink(Split.of(s.cfg)) is not None:
                s.pending = ("shrink", reason, step + 1)
            elif s.amp_step_down() is not None:
                s.pending = ("amp", reason, step + 1)
            elif "shrink" not in s.refused:
                s.refused.add("shrink")
                s.record_event("shrink_refused", step, f"{reason}; but micro-batch 1 with gradient checkpointing in "
                                                 f"{s.cfg.training.precision} is the smallest step already")
        s.phase = "optimizer"

    def _nonfinite(self, trainer, state, step: int, what: str = "loss") -> None:
        s = self.s
        decision = s.policy.observe(step + 1, True)
        scaler = getattr(trainer.accelerator, "scaler", None)
        if s.policy.run == 1:  # the first of a streak: keep the last good state (step `step`)
            s.fallback_from = step
            if scaler is None:
                trainer.model.zero_grad(set_to_none=True)
            if step > 0:
                s.checkpoint_now(trainer)
        if scaler is None:  # drop this update (a GradScaler skips it by itself)
            trainer.model.zero_grad(set_to_none=True)
        said = (f"the loss of step {step + 1} is not finite" if what == "loss" else
                f"the gradients of step {step + 1} are not finite (its loss is)")
        s.record_event(f"nonfinite_{what}", step + 1, f"{said}: its update is skipped ({s.policy.run} in a row; at "
                                                f"{s.policy.streak} the precision falls back)",
                 precision=s.cfg.training.precision, streak=s.policy.run)
        if decision == "fallback" and s.pending is None:
            s.pending = ("fallback", f"{s.policy.run} non-finite losses in a row (steps {s.policy.first_bad_step}-"
                                     f"{step + 1})", step + 1)
            trainer._tf_block_saves = True  # the state of a streak is not worth a checkpoint

    def on_optimizer_step(self, args, state, control, **kw):
        self.s.phase = "optimizer"

    def on_step_end(self, args, state, control, **kw):
        s = self.s
        s.phase = "boundary"
        trainer = s.trainer
        if trainer is None or not s.enabled:
            return
        if s.policy.run == 0:  # a good step: its RNG states, for a checkpoint written after a failure
            s.snapshot = (state.global_step, rng_snapshot())
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None and s.pending is None:
            scale = float(scaler.get_scale())
            if s.policy.scale_collapsed(scale):
                s.pending = ("fallback", f"the fp16 loss scale fell to {scale:g} (under {s.policy.min_loss_scale:g}): "
                                         "gradients overflow even unscaled", state.global_step)
                s.fallback_from = state.global_step
        if s.pending is not None:
            control.should_training_stop = True


def _all_reduce_max(flags: list[int], device) -> list[int]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    t = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]
