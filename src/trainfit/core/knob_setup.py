"""Knob values (trainfit.core.knobs, keyed by knob name) -> the TrainingSetup they describe.

The knobs with a `field` go onto the setup as they are; the few that stand for several fields or
depend on the hardware are mapped here: the method and the LoRA knobs, --gpus, --zero / --fsdp,
the image count, and the library versions (trainfit.core.runtime). The rest is
core.plan.intent's defaults for the hardware. Messages word each knob with `word` (the command
line's flag by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainfit.core.knobs import BY_NAME, KNOBS, flag_of
from trainfit.core.setup import FSDP_EQUIVALENT_STAGE, LoraSettings, TrainingSetup, method_trains_adapters, parse_method
from trainfit.errors import BadInputError

_LORA_KNOBS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


def knob_defaults() -> dict[str, Any]:
    return {k.name: k.default for k in KNOBS}


def setup_from_knobs(values: dict[str, Any], hardware, spec=None, *, word: Callable[[str], str] = flag_of
                     ) -> TrainingSetup:
    """The setup the knob values ask for; core.plan.intent fills in the rest for the hardware."""
    from trainfit.core.plan.intent import resolve_setup

    v = {**knob_defaults(), **values}
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise BadInputError(f"unknown knob {unknown[0]!r} (valid: {', '.join(BY_NAME)})")
    method = parse_method(v["method"], key=word("method"))
    wants_lora = any(v[name] is not None for name in _LORA_KNOBS)
    if method == "full" and v["method"] == "sft" and wants_lora:
        method = "lora"  # "SFT with LoRA flags" is LoRA training on instruction data
    elif wants_lora and method in ("full", "pretrain", "inference"):
        raise BadInputError(f"{'/'.join(word(n) for n in _LORA_KNOBS)} apply to LoRA training, "
                            f"not {word('method')} {v['method']}", hint="use --method lora, qlora or dpo, or drop them")
    lora = _lora(v, spec, word) if method_trains_adapters(method, lora_given=wants_lora) else None
    gpus, device = v["num_gpus"], v["device"]
    on_gpus = hardware is not None and hardware.gpu_count > 0 and device != "cpu"
    if gpus is not None and on_gpus and gpus > hardware.gpu_count:
        raise BadInputError(f"{word('num_gpus')} {gpus}: the hardware has {hardware.gpu_count} GPU(s)",
                            hint=f"use --gpus 1..{hardware.gpu_count}, or name more in --hardware (e.g. '{gpus}x ...')")
    if device == "cpu" or (device is None and hardware is not None and hardware.accelerator == "cpu"):
        gpus = gpus or 1
    direct = {k.field: v[k.name] for k in KNOBS if k.field is not None}
    for name in ("dora", "activation_offload", "optimizer_in_backward"):  # store_true flags may hold None
        direct[name] = bool(direct[name])
    return resolve_setup(hardware, method, lora=lora, precision=direct.pop("precision"), device=device,
                         num_gpus=gpus, quant=v["quant"], dpo_reference=v["dpo_reference"],
                         **direct, **_sharding(v), **_images(v), **_versions(v, word))


def _lora(v: dict, spec, word) -> LoraSettings:
    """The LoRA knobs over the one default (core.plan.space.default_lora: rank 16 on every linear
    layer of the blocks), the adapters plan and cloud plan."""
    from trainfit.core.plan.space import default_lora

    rank = 16 if v["lora_rank"] is None else v["lora_rank"]
    targets: list[str] | str = (default_lora(spec).target_modules if spec is not None
                                else ["q_proj", "k_proj", "v_proj", "o_proj"])
    given = v["lora_targets"]
    if given:
        t = given.strip() if isinstance(given, str) else given
        if isinstance(t, str):
            targets = "all-linear" if t == "all-linear" else [x.strip() for x in t.split(",") if x.strip()]
        else:
            targets = [str(x).strip() for x in t if str(x).strip()]
        if not targets:
            raise BadInputError(f"{word('lora_targets')}: {given!r} names no module",
                                hint="give names such as q_proj,v_proj, or all-linear")
    dropout = 0.05 if v["lora_dropout"] is None else v["lora_dropout"]
    return LoraSettings(rank=rank, alpha=v["lora_alpha"] or 2 * rank, dropout=dropout,
                        target_modules=targets)  # type: ignore[arg-type]


def _sharding(v: dict) -> dict:
    """--fsdp implies its ZeRO-equivalent stage; a different explicit --zero is refused by the
    rules (trainfit.core.knob_rules) with the fix."""
    fsdp = v["fsdp_strategy"] or "none"
    zero = v["zero_stage"] if v["zero_stage"] is not None else FSDP_EQUIVALENT_STAGE.get(fsdp, 0)
    return dict(zero_stage=zero, fsdp_strategy=fsdp)


def _images(v: dict) -> dict:
    """An image size alone means one image per example."""
    images = v["images_per_example"]
    if images is None:
        images = 1 if v["image_size"] else 0
    return dict(image_size=v["image_size"] or 0, images_per_example=images)


def _versions(v: dict, word) -> dict:
    """The library versions as the setup fields they decide (trainfit.core.runtime)."""
    from trainfit.core.runtime import bnb_keeps_input_for, transformers_knobs

    keeps = _from_version(word("bitsandbytes_version"), v["bitsandbytes_version"], bnb_keeps_input_for, False)
    tf_knobs = _from_version(word("transformers_version"), v["transformers_version"], transformers_knobs, {})
    return dict(bnb_keeps_input=keeps, **tf_knobs)


def _from_version(flag: str, version: str | None, parse, default):
    """`parse(version)`, or `default` when no version is known; a malformed one is the user's error."""
    if version is None:
        return default
    try:
        return parse(version)
    except ValueError as e:
        raise BadInputError(f"{flag}: {e}") from None
