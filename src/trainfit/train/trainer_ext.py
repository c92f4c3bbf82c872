"""A thin subclass over Transformers' Trainer (or TRL's SFT/DPO trainers) that

- writes checkpoints atomically (trainfit.train.checkpoints: staging dir, fsync, manifest,
  rename) and rotates only complete ones, instead of writing into checkpoint-N in place;
- counts the tokens it trains on (for tokens/s) without a device sync per micro-batch.

Everything else (optimizer, scheduler, RNG and data-position restore on resume, DDP/FSDP/
DeepSpeed) is the library's own code path.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from trainfit.train import checkpoints as ck


def with_trainfit(base: type, *, ckpt_dir: Path, keep_last: int, log) -> type:
    """Subclass `base` (Trainer, SFTTrainer, DPOTrainer) with trainfit's checkpoint writer."""

    class TrainfitTrainer(base):  # type: ignore[misc, valid-type]
        _tf_stage_root: str | None = None

        def _get_output_dir(self, trial):
            return self._tf_stage_root if self._tf_stage_root else super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            from accelerate.utils import broadcast_object_list

            step = self.state.global_step
            token = [secrets.token_hex(4) if self.is_world_process_zero() else None]
            if self.args.world_size > 1:
                broadcast_object_list(token)  # every rank writes into the same staging dir
            stage_root = ckpt_dir / f".staging-checkpoint-{step}-{token[0]}"
            if self.is_world_process_zero():
                stage_root.mkdir(parents=True)
            self.accelerator.wait_for_everyone()
            self._tf_stage_root = str(stage_root)
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self._tf_stage_root = None
            self.accelerator.wait_for_everyone()
            if self.is_world_process_zero():
                staged = stage_root / f"checkpoint-{step}"
                ck.seal(staged)
                ck.publish(staged, ckpt_dir / f"checkpoint-{step}", log=log)
                shutil.rmtree(stage_root)  # now empty
                for old in ck.rotate(ckpt_dir, keep_last):
                    log(f"removed {old.name} (keep_last={keep_last})")
            self.accelerator.wait_for_everyone()

        def training_step(self, model, inputs, *args, **kwargs):
            self._tf_count_tokens(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

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

    TrainfitTrainer.__name__ = f"Trainfit{base.__name__}"
    return TrainfitTrainer
