"""A thin subclass over Transformers' Trainer (or TRL's SFT/DPO trainers) that

- writes checkpoints atomically (trainfit.train.recovery.checkpoints: staging dir, fsync, manifest,
  rename) and rotates only complete ones, instead of writing into checkpoint-N in place;
- counts the tokens it trains on (for tokens/s) without a device sync per micro-batch;
- turns a failure to load the checkpoint it resumes from (model, optimizer, scheduler, scaler,
  RNG state) into a BadInputError naming the checkpoint and the file, instead of a traceback
  (run_dir.prepare_run_dir checks the files before anything starts; this is the backstop);
- does not report a tied output embedding (`lm_head.weight`) as a missing key on resume: tied
  weights are stored once, and that is expected;
- notes, per optimizer step, whether any micro-batch's loss was not finite (a tensor flag, read
  once per step by trainfit.train.recovery) and the step's gradient norm (NaN gradients can come
  with a finite loss), and lets recovery block checkpoints of a state it is about to abandon
  (`_tf_block_saves`) or force the one it needs (`_tf_force_save`);
- never writes a checkpoint whose trained parameters are not all finite (its manifest says
  `parameters_finite: true`): a checkpoint is the "last good state" a recovery goes back to;
- resets the running loss after each log when it is NaN (logging_nan_inf_filter is off, so
  non-finite losses are logged as what they are);
- resumes a checkpoint written with an fp16 GradScaler in a precision that has none (a precision
  fallback) without the scaler state.

Everything else (optimizer, scheduler, RNG and data-position restore on resume, DDP/FSDP/
DeepSpeed) is the library's own code path.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from trainfit.errors import BadInputError, TrainfitError, UnavailableError
from trainfit.files import DISK_FULL_ERRNOS as _DISK_FULL_ERRNOS
from trainfit.train.recovery import checkpoints as ck

_WEIGHTS = "the model weights (model*.safetensors / adapter_model.safetensors)"


# How a full disk surfaces while a checkpoint is written: an OSError from Python and safetensors
# ("os error 28"), torch.save's zip writer ("unexpected pos ..." / "file write failed").
_DISK_FULL_WORDS = ("no space left", "unexpected pos", "file write failed", "os error 28", "disk quota")


def disk_full(exc: BaseException | None) -> bool:
    """True when `exc` (or an exception it was raised from) says the disk is full."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            return True
        if isinstance(exc, (OSError, RuntimeError)) and any(w in str(exc).lower() for w in _DISK_FULL_WORDS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _disk_full_error(ckpt_dir: Path, step: int) -> UnavailableError:
    free = ""
    try:
        free = f" ({shutil.disk_usage(ckpt_dir).free / (1 << 30):.2f} GiB free there)"
    except OSError:
        pass
    done = ck.latest_complete(ckpt_dir, log=lambda message: None)
    last = f"checkpoint-{done.step}" if done else "the start (no complete checkpoint yet)"
    return UnavailableError(
        f"the disk filled up while writing the checkpoint of step {step} in {ckpt_dir}{free}; the half-written "
        f"checkpoint was removed and the complete ones are intact",
        hint=f"free some space (or lower checkpointing.keep_last), then run the same command with --resume to "
             f"continue from {last}")


class TrainfitTrainerMixin:
    """trainfit's part of the Trainer class with_trainfit makes: the checkpoint writer, the
    resume backstop, the non-finite flags and the token count. The class with_trainfit makes sets
    `_tf_ckpt_dir`, `_tf_keep_last` and `_tf_log` (a function taking one line)."""

    _tf_ckpt_dir: Path
    _tf_keep_last: int
    _tf_stage_root: str | None = None
    _tf_block_saves: bool = False  # recovery: the state is about to be abandoned
    _tf_force_save: bool = False  # recovery: this save is the one it continues from
    _tf_refused_saves: list  # steps whose state was not saved: non-finite parameters

    def __init__(self, *args, **kwargs):
        self._tf_refused_saves = []
        super().__init__(*args, **kwargs)

    def _get_output_dir(self, trial):
        return self._tf_stage_root if self._tf_stage_root else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        from accelerate.utils import broadcast_object_list

        if self._tf_block_saves and not self._tf_force_save:
            self._tf_log(f"not checkpointing step {self.state.global_step}: recovery continues from an earlier step")
            return
        if not self._tf_parameters_finite():
            # a checkpoint is a state to go back to: one with NaN / inf weights never is
            self._tf_refused_saves.append(self.state.global_step)
            self._tf_log(f"not checkpointing step {self.state.global_step}: its parameters are not finite (NaN or "
                         "inf); the last checkpoint stays the last good state")
            return
        step = self.state.global_step
        token = [secrets.token_hex(4) if self.is_world_process_zero() else None]
        if self.args.world_size > 1:
            broadcast_object_list(token)  # every rank writes into the same staging dir
        stage_root = self._tf_ckpt_dir / f".staging-checkpoint-{step}-{token[0]}"
        if self.is_world_process_zero():
            stage_root.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self._tf_stage_root = str(stage_root)
        try:
            super()._save_checkpoint(model, trial)
        except BaseException as exc:
            if self.args.world_size <= 1:  # our own half-written staging dir: never a checkpoint
                shutil.rmtree(stage_root, ignore_errors=True)
            if disk_full(exc):
                raise _disk_full_error(self._tf_ckpt_dir, step) from None
            raise
        finally:
            self._tf_stage_root = None
        self.accelerator.wait_for_everyone()
        if self.is_world_process_zero():
            staged = stage_root / f"checkpoint-{step}"
            ck.seal(staged, labels={"parameters_finite": True})
            ck.publish(staged, self._tf_ckpt_dir / f"checkpoint-{step}", log=self._tf_log)
            shutil.rmtree(stage_root)  # now empty
            for old in ck.rotate(self._tf_ckpt_dir, self._tf_keep_last):
                self._tf_log(f"removed {old.name} (keep_last={self._tf_keep_last})")
        self.accelerator.wait_for_everyone()

    # -- resuming: a checkpoint that cannot be loaded is bad input, not a crash ---------
    def _tf_loading(self, checkpoint, what: str, load):
        try:
            return load()
        except (TrainfitError, MemoryError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001
            import torch

            if isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            path = Path(str(checkpoint))
            raise BadInputError(
                f"--resume: cannot load {what} of {path.name}: {ck.describe_error(exc)}; the checkpoint is "
                f"damaged or was written by an incompatible version",
                hint=ck.checkpoint_hint(self._tf_ckpt_dir, path)) from exc

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        _warn_version(Path(str(resume_from_checkpoint)), self._tf_log)
        return self._tf_loading(resume_from_checkpoint, _WEIGHTS,
                                lambda: super(TrainfitTrainerMixin, self)._load_from_checkpoint(
                                    resume_from_checkpoint, model))

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        return self._tf_loading(checkpoint, "optimizer.pt / scheduler.pt",
                                lambda: super(TrainfitTrainerMixin, self)._load_optimizer_and_scheduler(checkpoint))

    def _load_scaler(self, checkpoint):
        if checkpoint is None or getattr(self.accelerator, "scaler", None) is None:
            return None  # no GradScaler in this precision (e.g. after a fallback from fp16)
        return self._tf_loading(checkpoint, "scaler.pt",
                                lambda: super(TrainfitTrainerMixin, self)._load_scaler(checkpoint))

    def _load_rng_state(self, checkpoint):
        if checkpoint is None:
            return super()._load_rng_state(checkpoint)
        return self._tf_loading(checkpoint, "rng_state.pth",
                                lambda: super(TrainfitTrainerMixin, self)._load_rng_state(checkpoint))

    def _issue_warnings_after_load(self, load_result):
        # A tied parameter (lm_head.weight sharing the input embedding) is saved once, so it
        # is "missing" from every checkpoint of a tied model: expected, not worth a line.
        # Other missing or unexpected keys are reported through trainfit's log, so they stay
        # visible when the libraries' logging is quietened.
        missing = list(getattr(load_result, "missing_keys", []))
        ignored = getattr(self.model, "_keys_to_ignore_on_save", None)
        if missing and ignored and set(missing) == set(ignored):
            self.model.tie_weights()  # what the Trainer does in this case
            missing = []
        missing = expected_missing_removed(self.model, missing)
        unexpected = list(getattr(load_result, "unexpected_keys", []))
        if missing:
            self._tf_log(f"warning: keys missing from the checkpoint's model weights: {missing}")
        if unexpected:
            self._tf_log(f"warning: unexpected keys in the checkpoint's model weights: {unexpected}")

    def training_step(self, model, inputs, *args, **kwargs):
        self._tf_count_tokens(inputs)
        loss = super().training_step(model, inputs, *args, **kwargs)
        if hasattr(loss, "isfinite"):  # a device-side flag: no sync per micro-batch
            bad = ~loss.detach().isfinite().all()
            flag = getattr(self, "_tf_nonfinite", None)
            self._tf_nonfinite = bad if flag is None else flag | bad
        return loss

    def _tf_parameters_finite(self) -> bool:
        """Every trained parameter finite, on every rank (one flag per rank, reduced)."""
        import torch

        bad = torch.zeros((), dtype=torch.bool, device=self.args.device)
        for p in self.model.parameters():
            if p.requires_grad and p.numel():
                bad |= ~torch.isfinite(p.detach()).all().to(bad.device)
        if self.args.world_size > 1:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                flag = bad.to(torch.int32)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                bad = flag.bool()
        return not bool(bad.item())

    def _get_grad_norm(self, model, grad_norm=None):
        # The Trainer computes the gradient norm of every optimizer step (before clipping) and
        # keeps it in a local variable: kept here for the non-finite check before the update.
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self._tf_grad_norm = norm
        return norm

    def _maybe_log_save_evaluate(self, tr_loss, *args, **kwargs):
        # With logging_nan_inf_filter off (the runner's choice: a NaN loss is recorded as NaN),
        # the Trainer's reset `tr_loss -= tr_loss` leaves a NaN in the running sum forever:
        # after a log, start the next window from zero.
        super()._maybe_log_save_evaluate(tr_loss, *args, **kwargs)
        if self._globalstep_last_logged == self.state.global_step and hasattr(tr_loss, "isfinite"):
            if not bool(tr_loss.isfinite().all().item()):
                tr_loss.zero_()

    def _tf_take_nonfinite(self) -> tuple[bool, bool]:
        """(a micro-batch of this optimizer step had a non-finite loss, the step's gradient norm is
        NaN or inf), and reset both. Both device-side flags come back in one device->host transfer:
        one sync per optimizer step."""
        import math

        import torch

        loss_bad, self._tf_nonfinite = getattr(self, "_tf_nonfinite", None), None
        norm, self._tf_grad_norm = getattr(self, "_tf_grad_norm", None), None
        on_device = {}
        if loss_bad is not None:
            on_device["loss"] = loss_bad
        if torch.is_tensor(norm):
            on_device["grad"] = ~torch.isfinite(norm.detach()).all()
        elif norm is not None:  # a host number (DeepSpeed's engine returns a float)
            on_device["grad"] = torch.tensor(not math.isfinite(float(norm)))
        if not on_device:
            return False, False
        device = next(iter(on_device.values())).device
        read = dict(zip(on_device, torch.stack([flag.to(device) for flag in on_device.values()]).tolist()))
        return bool(read.get("loss", False)), bool(read.get("grad", False))

    def _tf_count_tokens(self, inputs) -> None:
        # Sum attention masks (real tokens, not padding); kept as a tensor: no device sync.
        total = None
        for key, value in inputs.items():
            if key.endswith("attention_mask") and hasattr(value, "sum"):
                total = value.sum() if total is None else total + value.sum()
        if total is None:
            ids = inputs.get("input_ids")
            total = ids.numel() if ids is not None else 0
        self._tf_tokens = getattr(self, "_tf_tokens", 0) + total

    def tokens_seen(self) -> float:
        t = getattr(self, "_tf_tokens", 0)
        return float(t.item() if hasattr(t, "item") else t)


def with_trainfit(base: type, *, ckpt_dir: Path, keep_last: int, log) -> type:
    """Subclass `base` (Trainer, SFTTrainer, DPOTrainer) with trainfit's checkpoint writer."""

    class TrainfitTrainer(TrainfitTrainerMixin, base):  # type: ignore[misc, valid-type]
        _tf_ckpt_dir = ckpt_dir
        _tf_keep_last = keep_last
        _tf_log = staticmethod(log)

    TrainfitTrainer.__name__ = f"Trainfit{base.__name__}"
    return TrainfitTrainer


def expected_missing_removed(model, missing: list[str]) -> list[str]:
    """`missing` without the keys of tied parameters whose tensor was loaded under another name
    (a tied lm_head.weight shares the input embedding, and checkpoints store it once)."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    gone = set(missing)
    tied_loaded = {n for names in groups.values() if len(names) > 1 and any(m not in gone for m in names)
                   for n in names}
    return [k for k in missing if k not in tied_loaded]


def _warn_version(checkpoint: Path, log) -> None:
    """Say when the checkpoint was written by another Transformers version (the Trainer's own
    warning is hidden with the libraries' logging)."""
    import json

    import transformers

    try:
        written = json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("transformers_version")
    except (OSError, ValueError, AttributeError):
        return
    if written and written != transformers.__version__:
        log(f"note: {checkpoint.name} was written with Transformers {written}, this is {transformers.__version__}")
