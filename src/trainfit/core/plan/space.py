"""Building blocks of search spaces: knob products, micro-batch chains, coherence rules."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence

from trainfit.core.models.spec import ModelSpec
from trainfit.core.knob_rules import knob_problems
from trainfit.core.plan.multinode import coherent_hybrid
from trainfit.core.setup import LoraSettings, TrainingSetup

POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64, 128)


def coherent(s: TrainingSetup) -> bool:
    """Combinations that mean something (the rest are refused by the memory model's checks)."""
    if s.offload != "none" and s.zero_stage == 0:
        return False  # offload is a ZeRO feature
    if s.offload == "optimizer+params" and s.zero_stage != 3:
        return False  # parameters are sharded (and so offloadable) only in stage 3
    if s.zero_stage and s.num_gpus == 1 and s.offload == "none":
        return False  # one GPU: ZeRO only makes sense to offload
    if s.zero_stage and s.device not in ("cuda", "rocm", "xpu"):
        return False
    if s.zero_stage and s.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit"):
        return False  # DeepSpeed runs its own (CPU) Adam under ZeRO; bitsandbytes optimizers are not ZeRO-aware
    if s.quant != "none" and s.method in ("full", "pretrain"):
        return False
    if s.method in ("lora", "qlora") and s.lora is None:
        return False
    if not coherent_hybrid(s):
        return False  # hybrid sharding: ZeRO-3 / FSDP full shard inside each of several nodes
    if knob_problems(s):
        return False  # FSDP / activation offload / optimizer-in-backward combinations no tool runs
    return True


def product(base: TrainingSetup, **axes: Sequence) -> list[TrainingSetup]:
    """Every combination of the axis values (deterministic order, duplicates removed)."""
    names = list(axes)
    out: list[TrainingSetup] = []
    seen: set[TrainingSetup] = set()
    for values in itertools.product(*(axes[n] for n in names)):
        s = dataclasses.replace(base, **dict(zip(names, values)))
        if s not in seen and coherent(s):
            seen.add(s)
            out.append(s)
    return out


def micro_batches(target_global: int, devices: int, low: int = 1, high: int = 128) -> list[int]:
    """Powers of two in [low, high] whose micro-batch x devices does not exceed the target."""
    cap = max(1, target_global // max(1, devices))
    return [b for b in POWERS_OF_TWO if low <= b <= min(high, cap)] or [1]


def with_batch(s: TrainingSetup, micro_batch: int, target_global: int) -> TrainingSetup:
    """Micro-batch with the accumulation that keeps (at least) the target global batch."""
    accum = max(1, math.ceil(target_global / (micro_batch * s.num_gpus)))
    return dataclasses.replace(s, micro_batch=micro_batch, grad_accum=accum)


def batch_chains(bases: Iterable[TrainingSetup], batches: Sequence[int], target_global: int) -> list[Iterable[TrainingSetup]]:
    """One chain per base: its micro-batches ascending (memory grows along a chain). Lazy: a
    chain usually stops at its first setup that does not fit, so the rest is never built."""
    ordered = sorted(batches)

    def chain(base: TrainingSetup) -> Iterable[TrainingSetup]:  # binds `base` now, builds setups later
        return (with_batch(base, mb, target_global) for mb in ordered)

    return [chain(b) for b in bases]


def lora_variant(s: TrainingSetup, method: str, lora: LoraSettings, *, precision: str | None = None) -> TrainingSetup:
    """`s` as LoRA / QLoRA (or DPO with adapters): frozen base, no optimizer offload needed."""
    quant = "nf4-dq" if method == "qlora" or (method == "dpo" and s.quant != "none") else "none"
    kw = dict(lora=lora, quant=quant, offload="none", zero_stage=min(s.zero_stage, 2) if s.num_gpus > 1 else 0)
    if precision is not None:
        kw["precision"] = precision
    if s.method == "dpo" or method == "dpo":
        return dataclasses.replace(s, method="dpo", dpo_reference="lora-base", **kw)
    return dataclasses.replace(s, method=method, **kw)


def default_lora(spec: ModelSpec) -> LoraSettings:
    """Rank 16 / alpha 32 on every linear module of the blocks (QLoRA paper's choice), not lm_head."""
    from trainfit.core.models.params import module_names

    return LoraSettings(rank=16, alpha=32, target_modules=[m for m in module_names(spec) if m != "lm_head"])


# Attention projections as the model families name them (the LoRA paper adapted q and v; PEFT's
# default for Llama-style models, and estimate's, is q,k,v,o).
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn", "query_key_value", "Wqkv")


def attention_lora(spec: ModelSpec) -> LoraSettings | None:
    """Rank 16 / alpha 32 on the attention projections only: about a quarter of default_lora's adapted
    parameters and their activations. None when the model names no attention projection we know."""
    from trainfit.core.models.params import module_names

    names = [m for m in module_names(spec) if m in ATTENTION_MODULES]
    return LoraSettings(rank=16, alpha=32, target_modules=names) if names else None
