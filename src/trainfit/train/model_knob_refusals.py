"""Run-config checks for the loss-kernel, DoRA, pre-quantised-base and image knobs.

`trainfit estimate` / `plan` model all of them; the trainer runs DoRA (PEFT use_dora=True, see
trainfit.export.peft_config) and refuses the others by key rather than silently ignoring them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainfit.train.run_config import RunConfig


def model_knob_errors(cfg: RunConfig) -> list[str]:
    t = cfg.training
    errs: list[str] = []
    if t.loss != "standard":
        extra = " (it needs the liger-kernel package and a CUDA GPU)" if t.loss == "fused" else ""
        errs.append(f"training.loss: {t.loss!r} cross-entropy is modelled by trainfit estimate/plan but "
                    f"trainfit train does not run it yet{extra}; use loss: standard")
    if t.quant in ("gptq", "awq"):
        errs.append(f"training.quant: {t.quant!r} loads a pre-quantised {t.quant.upper()} checkpoint, which "
                    "trainfit train does not load yet (estimate/plan model it); use nf4-dq or int8, quantised "
                    "by bitsandbytes while loading")
    uses_lora = cfg.method in ("lora", "qlora") or (cfg.method == "dpo" and t.lora is not None)
    if t.dora and not uses_lora:
        errs.append(f"training.dora: DoRA is a LoRA variant; use method lora or qlora (or dpo with training.lora), "
                    f"not {cfg.method}")
    if t.image_size or t.images_per_example:
        errs.append("training.image_size / training.images_per_example: trainfit train has no image data "
                    "pipeline yet (estimate/plan model the image tokens); remove them")
    return errs
