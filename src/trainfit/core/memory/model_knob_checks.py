"""Checks of the loss-kernel, DoRA, pre-quantised-base and image knobs against a model: every
problem in one BadInputError naming the flag, what is wrong and what is valid."""

from __future__ import annotations

from trainfit.core.memory.quant_formats import PREQUANTISED
from trainfit.core.model_spec import ModelSpec
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError

MAX_IMAGE_SIZE = 1 << 16
MAX_IMAGES = 1024


def check_model_knobs(model: ModelSpec, setup: TrainingSetup) -> None:
    problems: list[str] = []
    uses_lora = setup.trains_adapters
    if setup.loss != "standard" and setup.method in ("dpo", "inference"):
        problems.append(f"--loss {setup.loss} replaces the causal-LM cross-entropy of pretrain, full, lora and "
                        f"qlora; method {setup.method} has none (valid here: standard)")
    if setup.dora and not uses_lora:
        problems.append(f"--dora is a LoRA variant: use --method lora or qlora (or dpo with LoRA flags), "
                        f"not {setup.method}")
    if setup.dora and setup.quant in PREQUANTISED:
        problems.append(f"--dora with --quant {setup.quant}: PEFT's {setup.quant.upper()} LoRA layers do not "
                        "support DoRA (use --quant nf4, nf4-dq or int8 for QDoRA, or drop --dora)")
    for flag, value, high in (("--image-size", setup.image_size, MAX_IMAGE_SIZE),
                              ("--images-per-example", setup.images_per_example, MAX_IMAGES)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            problems.append(f"{flag} must be an integer from 0 to {high}, got {value!r}")
    if (setup.image_size or setup.images_per_example) and model.vision is None:
        problems.append(f"--image-size / --images-per-example: {model.id} has no vision tower (they apply to "
                        "vision-language models such as qwen2-vl-2b)")
    elif setup.image_size and model.architecture != "qwen2_vl":
        problems.append(f"--image-size: only Qwen2-VL's dynamic resolution is modelled; for {model.id} leave it "
                        "out (its default tokens per image are used)")
    if setup.image_size and not setup.images_per_example:
        problems.append("--image-size needs --images-per-example >= 1")
    if problems:
        raise BadInputError("; ".join(problems))
