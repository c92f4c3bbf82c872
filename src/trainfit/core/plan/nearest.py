"""Policy "nearest setting that fits": the smallest change to the user's setup that fits.

Tiers, in order: the user's method with its own knobs changed; LoRA instead of full weights;
QLoRA (only where bitsandbytes runs); then shorter sequences, which change the data. So a 32B
full fine-tune on 4x A100 is told "ZeRO-3 + optimizer offload + checkpointing", never "QLoRA"
while some full setting fits. Inside a tier the cheapest change wins, then the faster setting.
Change costs follow what a practitioner gives up: checkpointing (~30 % slower, same result) <
16-bit frozen base < mixed precision < smaller micro-batch with more accumulation (same global
batch) < 8-bit optimizer < ZeRO sharding < CPU offload (slow).
"""

from __future__ import annotations

import dataclasses

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import space, variants
from trainfit.core.plan.engine import Candidate, MemoryFn, SearchResult, Tier, search
from trainfit.core.plan.hardware_rules import DeviceRules, rules_for
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import LoraSettings, TrainingSetup, parse_variant

_OFFLOAD_COST = {"none": 0.0, "optimizer": 5.0, "optimizer+params": 6.0}


def change_cost(old: TrainingSetup, new: TrainingSetup) -> float:
    cost = 0.0
    if new.grad_checkpointing != old.grad_checkpointing:
        cost += 1.0
    if new.precision != old.precision:
        cost += 1.5 if new.lora is not None and not new.precision.endswith("mixed") else 2.0
    if new.micro_batch < old.micro_batch:
        cost += 2.5 if new.micro_batch == 1 else 2.0
    if new.optimizer != old.optimizer:
        cost += 3.0
    if new.zero_stage > old.zero_stage:
        cost += 3.0 + new.zero_stage / 2
    cost += max(0.0, _OFFLOAD_COST[new.offload] - _OFFLOAD_COST[old.offload])
    return cost


def _knob_tier(label: str, base: TrainingSetup, user: TrainingSetup, rules: DeviceRules) -> Tier:
    """Every combination of the knobs that save memory, around `base`."""
    half = rules.half
    precisions = [base.precision]
    if base.precision == "fp32" and half:
        precisions.append(f"{half}-mixed")
    if base.lora is not None and half and base.precision != half:
        precisions.append(half)  # PEFT users load the frozen base in 16-bit
    optimizers = [base.optimizer]
    if base.optimizer in ("adamw", "lion", "sgd-momentum") and "adamw-8bit" in rules.optimizers \
            and base.method != "inference":
        optimizers.append("adamw-8bit")
    zeros, offloads = [base.zero_stage], [base.offload]
    if rules.device in ("cuda", "rocm") and base.method != "inference":
        if base.num_gpus > 1:
            zeros += [z for z in (1, 2, 3) if z > base.zero_stage]
        if base.lora is None:  # frozen bases gain nothing from optimizer offload
            zeros += [2, 3]
            offloads += ["optimizer", "optimizer+params"]
    ckpts = [base.grad_checkpointing] + (["full"] if base.method != "inference" else [])
    bases = space.product(base, grad_checkpointing=list(dict.fromkeys(ckpts)), precision=list(dict.fromkeys(precisions)),
                          optimizer=list(dict.fromkeys(optimizers)), zero_stage=list(dict.fromkeys(zeros)),
                          offload=list(dict.fromkeys(offloads)))
    target = user.global_batch
    if base.method == "inference":
        batches = [b for b in space.POWERS_OF_TWO if b <= user.micro_batch]
        chains = [[dataclasses.replace(b, micro_batch=mb) for mb in batches] for b in bases]
    else:
        batches = [b for b in space.POWERS_OF_TWO if b < user.micro_batch] + [user.micro_batch]
        chains = space.batch_chains(bases, batches, target)
    return Tier(label, chains)


def _variant_of(s: TrainingSetup) -> str:
    """The variant name (core.plan.variants) of a setup."""
    if s.method == "dpo" and s.lora is not None:
        return "dpo+qlora" if s.quant != "none" else "dpo+lora"
    if s.method == "inference" and s.quant != "none":
        return "inference+nf4" if s.quant.startswith("nf4") else "inference+int8"
    return s.method


def _as_variant(base: TrainingSetup, variant: str, lora: LoraSettings, half: str) -> TrainingSetup:
    """`base` (the user's knobs) moved to a fallback variant."""
    v = parse_variant(variant)
    if v.method == "inference":
        return dataclasses.replace(base, quant=v.quant)
    quantised = v.quant != "none"
    # A quantised base computes in the 16-bit type (pure, the adapters stay fp32 in PEFT).
    precision = (half if base.precision == "fp32" else base.precision.replace("-mixed", "")) if quantised else None
    moved = space.lora_variant(base, v.method, lora, precision=precision)
    return dataclasses.replace(moved, quant=v.quant) if quantised else moved


def nearest_tiers(setup: TrainingSetup, rules: DeviceRules, lora: LoraSettings | None = None) -> list[Tier]:
    lora = setup.lora or lora or LoraSettings()
    half = rules.half or "bf16"
    own = _variant_of(setup)
    chain = variants.chain(setup.method)
    fallbacks = chain[chain.index(own) + 1:] if own in chain else ()
    tiers: list[Tier] = []
    for seq in [setup.seq_len] + [setup.seq_len // f for f in (2, 4) if setup.seq_len // f >= 64]:
        base = dataclasses.replace(setup, seq_len=seq)
        tag = "" if seq == setup.seq_len else f", sequence length {seq}"
        tiers.append(_knob_tier(f"{variants.LABELS[own]}{tag}", base, setup, rules))
        for variant in fallbacks:
            if variants.needs_bitsandbytes(variant) and not rules.quantization:
                continue
            tiers.append(_knob_tier(f"{variants.LABELS[variant]}{tag}", _as_variant(base, variant, lora, half),
                                    setup, rules))
    return tiers


def nearest_fitting_search(model: ModelSpec, setup: TrainingSetup, hardware: HardwareProfile,
                           memory_fn: MemoryFn | None = None, framework=None) -> SearchResult:
    """`framework` (core.frameworks.Framework): `setup` is as that tool runs it, and so is every
    candidate: the variants start from trainfit's knobs and the tool's behaviours are applied to each."""
    from trainfit.core.frameworks import base_setup, framed_tiers

    rules = rules_for(hardware, setup.device)

    def key(c: Candidate) -> tuple:
        return (change_cost(setup, c.setup), c.speed.step_seconds if c.speed else 0.0, c.need_ratio)

    start = setup if framework is None or framework.is_own else base_setup(setup, framework)
    tiers = framed_tiers(nearest_tiers(start, rules), framework)
    return search(model, hardware, tiers, rank_key=key, memory_fn=memory_fn, rules=rules)


def nearest_fitting(model: ModelSpec, setup: TrainingSetup, hardware: HardwareProfile,
                    framework=None) -> TrainingSetup | None:
    """`setup` when it fits, else the nearest fitting setup (see module doc), else None."""
    from trainfit.core.memory import estimate_memory
    from trainfit.core.plan.host_ram import host_ram_ratio

    memory = estimate_memory(model, setup, hardware)
    if memory.fits is not False and host_ram_ratio(memory, setup, hardware) <= 1:  # the search's own test
        return setup
    result = nearest_fitting_search(model, setup, hardware, framework=framework)
    return result.best.setup if result.best else None


def describe_changes(old: TrainingSetup, new: TrainingSetup) -> list[str]:
    """Human-readable field changes, e.g. 'micro_batch 8 -> 1'."""
    out = []
    for f in dataclasses.fields(TrainingSetup):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            if f.name == "lora":
                out.append(f"lora r={b.rank} alpha={b.alpha} on {_targets(b)}" if b else "no lora")
            else:
                out.append(f"{f.name} {a} -> {b}")
    return out


def _targets(lora: LoraSettings) -> str:
    t = lora.target_modules
    return t if isinstance(t, str) else ",".join(t)
