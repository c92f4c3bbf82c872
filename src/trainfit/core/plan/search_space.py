"""The search space of one mode: the tiers (method variant x sequence length, on the devices alone
or with CPU offload) the engine walks in order, each a list of batch chains over the knobs the
hardware runs."""

from __future__ import annotations

import dataclasses

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import multinode, space, variants
from trainfit.core.plan.engine import Tier
from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.modes import ModeTargets, shorter_seq_lens
from trainfit.core.plan.request import PlanRequest
from trainfit.core.setup import LoraSettings, TrainingSetup


def _tier(label: str, base: TrainingSetup, rules: DeviceRules, t: ModeTargets, global_batch: int, *,
          offload: bool) -> Tier:
    inference = base.method == "inference"
    precisions = [base.precision]
    if rules.device == "cpu" and base.precision in ("fp32", "bf16-mixed"):
        # Both on every CPU: bf16 is emulated on most, and where it has instructions (AVX512-BF16,
        # AMX) autocast's casts can still cost more than they save on a small model. The speed
        # model ranks them; on this machine the plan's probe checks it.
        precisions.append("bf16-mixed" if base.precision == "fp32" else "fp32")
    optimizers = ["adamw"]
    if "adamw-8bit" in rules.optimizers and base.lora is None and not inference:
        optimizers.append("adamw-8bit")
    zeros, offloads = [0], ["none"]
    if rules.max_zero_stage and not inference:
        zeros = [0, 1, 2, 3] if base.lora is None else [0, 2]
    if offload:
        zeros, offloads = [2, 3], ["optimizer", "optimizer+params"]
    # Eager attention only ever loses on GPUs (more memory, no faster); CPUs get both kernels.
    attention = rules.attention if rules.device == "cpu" else tuple(a for a in rules.attention if a != "eager")
    bases = space.product(base, precision=precisions, optimizer=optimizers,
                          grad_checkpointing=("none",) if inference else ("none", "full"),
                          attention=attention or rules.attention, zero_stage=zeros, offload=offloads,
                          hybrid_shard=multinode.hybrid_options(base))
    if inference:
        batches = [b for b in space.POWERS_OF_TWO if b <= max(t.micro_batch_max, 1) * 2]
        return Tier(label, [[dataclasses.replace(b, micro_batch=mb) for mb in batches] for b in bases])
    batches = space.micro_batches(global_batch, base.num_gpus, high=t.micro_batch_max)
    return Tier(label, space.batch_chains(bases, batches, global_batch))


def mode_seq_lens(req: PlanRequest, t: ModeTargets, model: ModelSpec) -> list[int]:
    if req.seq_len is not None:
        return [req.seq_len]
    fitting = [s for s in t.seq_lens if s <= model.max_position_embeddings]
    return fitting or [model.max_position_embeddings]


def _base(req: PlanRequest, variant: str, rules: DeviceRules, seq: int, lora: LoraSettings) -> TrainingSetup:
    """The variant's base setup with the request's image knobs (vision-language models)."""
    base = variants.base_setup(variant, req.hardware, rules, seq_len=seq, lora=lora)
    if req.image_size or req.images_per_example:
        base = dataclasses.replace(base, image_size=req.image_size, images_per_example=req.images_per_example)
    return base


def mode_tiers(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec, global_batch: int) -> list[Tier]:
    """The mode's sequence lengths for every method variant (the user's method first), then, when the
    user gave no --seq-len, shorter sequences down to SEQ_FLOOR: a shorter context is given up only
    after every method has failed at the mode's own lengths."""
    lora = req.lora or space.default_lora(model)
    chain = [v for v in variants.chain(req.method)
             if not (variants.needs_bitsandbytes(v) and not rules.quantization)]
    seqs = mode_seq_lens(req, t, model)
    tiers = []
    for variant in chain:
        tiers += _variant_tiers(req, t, rules, global_batch, variant, seqs, lora,
                                tag=lambda seq: f" at {seq} tokens" if len(seqs) > 1 else "")
    shorter = shorter_seq_lens(seqs, model.max_position_embeddings) if req.seq_len is None else []
    for seq in shorter:
        for variant in chain:
            tiers += _variant_tiers(req, t, rules, global_batch, variant, [seq], lora,
                                    tag=lambda seq: f" at {seq} tokens (below {t.mode}'s {min(seqs)})")
    # Last: adapters on the attention projections only (fewer adapter states and activations), for
    # the default all-linear LoRA; a user's own --lora targets are kept.
    attention = space.attention_lora(model) if req.lora is None else None
    if attention is not None and attention != lora:
        for variant in [v for v in chain if variants.uses_adapters(v)]:
            tiers += _variant_tiers(req, t, rules, global_batch, variant, [*seqs, *shorter], attention,
                                    tag=lambda seq: f" on attention only at {seq} tokens")
    return tiers


def _variant_tiers(req: PlanRequest, t: ModeTargets, rules: DeviceRules, global_batch: int, variant: str,
                   seqs: list[int], lora: LoraSettings, tag) -> list[Tier]:
    """One variant at these sequence lengths: on the devices alone, then with CPU offload (full weights)."""
    label = variants.LABELS[variant]
    tiers = [_tier(f"{label}{tag(seq)}", _base(req, variant, rules, seq, lora), rules, t, global_batch,
                   offload=False) for seq in seqs]
    probe = _base(req, variant, rules, seqs[0], lora)
    full_weights = probe.lora is None and probe.method not in ("inference",)
    if t.offload and full_weights and rules.device in ("cuda", "rocm"):
        tiers += [_tier(f"{label} with CPU offload{tag(seq)}", _base(req, variant, rules, seq, lora), rules, t,
                        global_batch, offload=True) for seq in seqs]
    return tiers
