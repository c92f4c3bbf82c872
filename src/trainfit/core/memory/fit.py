"""nearest_fitting: the closest change to a setup that makes it fit the hardware.

Changes are tried from the least to the most intrusive, alone and then combined (up to four),
and the cheapest combination that fits wins. Cost ranks follow what a practitioner gives up:
gradient checkpointing (~30 % slower, same result) < smaller micro-batch with more accumulation
(same global batch) < 8-bit optimizer < ZeRO sharding / offload < LoRA < QLoRA < shorter sequences.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from trainfit.core.model_spec import ModelSpec
from trainfit.core.profile import HardwareProfile
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import TrainfitError

Change = tuple[str, float, Callable[[TrainingSetup], TrainingSetup | None]]


def _replace(**kw):
    return lambda s: dataclasses.replace(s, **kw)


def _micro_batch_one(s: TrainingSetup) -> TrainingSetup | None:
    if s.micro_batch == 1:
        return None
    return dataclasses.replace(s, micro_batch=1, grad_accum=s.grad_accum * s.micro_batch)


def _half_batch(s: TrainingSetup) -> TrainingSetup | None:
    if s.micro_batch < 2 or s.micro_batch % 2:
        return None
    return dataclasses.replace(s, micro_batch=s.micro_batch // 2, grad_accum=s.grad_accum * 2)


def _to_lora(s: TrainingSetup) -> TrainingSetup | None:
    if s.method not in ("full", "pretrain", "dpo") or (s.method == "dpo" and s.lora is not None):
        return None
    if s.method == "dpo":
        return dataclasses.replace(s, lora=LoraSettings(), dpo_reference="lora-base")
    return dataclasses.replace(s, method="lora", lora=s.lora or LoraSettings(), zero_stage=min(s.zero_stage, 2)
                               if s.num_gpus > 1 else 0, offload="none")


def _to_qlora(s: TrainingSetup) -> TrainingSetup | None:
    if s.method not in ("full", "pretrain", "lora"):
        return None
    return dataclasses.replace(s, method="qlora", quant="nf4-dq", lora=s.lora or LoraSettings(),
                               precision="bf16" if s.precision == "fp32" else s.precision,
                               zero_stage=0 if s.num_gpus == 1 else min(s.zero_stage, 2), offload="none")


def _changes(setup: TrainingSetup) -> list[Change]:
    out: list[Change] = []
    if setup.method != "inference":
        if setup.grad_checkpointing != "full":
            out.append(("gradient checkpointing on", 1, _replace(grad_checkpointing="full")))
        out.append(("halve the micro-batch, double gradient accumulation", 2, _half_batch))
        out.append(("micro-batch 1, gradient accumulation raised to keep the global batch", 2.5, _micro_batch_one))
        if setup.optimizer in ("adamw", "lion", "sgd-momentum"):
            out.append(("8-bit AdamW optimizer", 3, _replace(optimizer="adamw-8bit")))
        if setup.num_gpus > 1:
            for z in (1, 2, 3):
                if z > setup.zero_stage:
                    out.append((f"DeepSpeed ZeRO-{z}", 3 + z / 2, _replace(zero_stage=z)))
        if setup.method in ("full", "pretrain") and (setup.num_gpus > 1 or setup.zero_stage > 0):
            out.append(("offload optimizer to CPU (ZeRO-2)", 5,
                        _replace(offload="optimizer", zero_stage=max(2, setup.zero_stage))))
        if setup.method not in ("pretrain",):
            out.append(("LoRA instead of full fine-tuning", 6, _to_lora))
            out.append(("QLoRA (4-bit NF4 base, double quantisation)", 7, _to_qlora))
        if setup.precision == "fp32":
            out.append(("bf16 mixed precision", 2, _replace(precision="bf16-mixed")))
        if setup.lora is not None and setup.precision in ("bf16-mixed", "fp16-mixed"):
            # The frozen base needs no fp32 copy: PEFT users load it in 16-bit (adapters stay fp32).
            pure = "bf16" if setup.precision == "bf16-mixed" else "fp16"
            out.append((f"frozen base weights in {pure}", 1.5, _replace(precision=pure)))
    else:
        if setup.quant == "none":
            out.append(("8-bit weights", 3, _replace(quant="int8")))
            out.append(("4-bit NF4 weights", 4, _replace(quant="nf4-dq")))
        if setup.micro_batch > 1:
            out.append(("batch 1", 2, _replace(micro_batch=1)))
        if setup.precision == "fp32":
            out.append(("bf16 weights", 1, _replace(precision="bf16")))
    for frac, cost in ((2, 8), (4, 9)):
        if setup.seq_len // frac >= 64:
            out.append((f"sequence length {setup.seq_len // frac}", cost,
                        _replace(seq_len=setup.seq_len // frac)))
    return out


def nearest_fitting(model: ModelSpec, setup: TrainingSetup, hardware: HardwareProfile) -> TrainingSetup | None:
    """The cheapest setup (see module doc) that fits `hardware`, or None if nothing tried fits.

    Returns `setup` itself when it already fits. `describe_changes(setup, result)` lists the changes.
    """
    from trainfit.core.memory.estimate import estimate_memory

    if estimate_memory(model, setup, hardware).fits is not False:
        return setup
    changes = _changes(setup)
    candidates = []
    for depth in range(1, 5):
        for combo in itertools.combinations(changes, depth):
            candidates.append((sum(c[1] for c in combo), combo))
    candidates.sort(key=lambda x: x[0])
    for _, combo in candidates:
        s: TrainingSetup | None = setup
        for _, _, apply in combo:
            s = apply(s) if s is not None else None
        if s is None or s == setup:
            continue
        try:
            if estimate_memory(model, s, hardware).fits:
                return s
        except TrainfitError:
            continue
    return None


def describe_changes(old: TrainingSetup, new: TrainingSetup) -> list[str]:
    """Human-readable field changes, e.g. 'micro_batch 8 -> 1'."""
    out = []
    for f in dataclasses.fields(TrainingSetup):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            if f.name == "lora":
                out.append(f"lora r={b.rank} alpha={b.alpha} on {','.join(b.target_modules)}" if b else "no lora")
            else:
                out.append(f"{f.name} {a} -> {b}")
    return out
