"""Weights: the model's weights on each device, and a DPO run's frozen reference copy.

states.model_states works out the per-device bytes (dtype, quantisation, sharding, offload); this
module says which of them make the weights component and describes them.
"""

from __future__ import annotations

import dataclasses

from trainfit.core.memory import quant_formats
from trainfit.core.memory.fsdp import fsdp_shards
from trainfit.core.memory.states import model_states
from trainfit.core.memory.step import TrainingStep
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import PREQUANTISED, TrainingSetup


def weights_bytes(step: TrainingStep) -> float:
    """Bytes of weights alive through the whole step: the base weights, their quantisation scales
    and the adapters."""
    states = step.states
    return states.weights + states.quant_overhead + states.lora


def reference_model_bytes(step: TrainingStep) -> tuple[float, float]:
    """(per GPU, per host) bytes of DPO's frozen reference model: a second copy of the base weights
    when the reference is a separate model. With adapters, PEFT's reference is the base with the
    adapters switched off, so only a full fine-tune's reference is a model of its own."""
    setup = step.setup
    if not (step.dpo and setup.dpo_reference == "separate"):
        return 0.0, 0.0
    if step.full:
        return full_reference_bytes(step.model, step.stats, setup)
    return step.states.weights + step.states.quant_overhead, 0.0


def full_reference_bytes(model: ModelSpec, st, setup: TrainingSetup) -> tuple[float, float]:
    """(per GPU, per host) bytes of a full fine-tune's DPO reference, a frozen copy of the base model.
    TRL's DPOTrainer hands it to the policy's engine (trl.models.utils.prepare_deepspeed / prepare_fsdp):
    * DeepSpeed: deepspeed.initialize casts it to the engine's 16-bit dtype (DeepSpeedEngine.
      _configure_distributed_model); under ZeRO-3 it keeps stage 3, so it is partitioned over the ranks
      like the policy's weights (offload_param included); any other stage becomes 0, a whole copy per GPU;
    * FSDP wraps it like the policy: sharded flat parameters in the loaded dtype, offloaded with them;
    * with neither, it is the model's own copy (its dtype, whole on every GPU)."""
    if (setup.uses_deepspeed and setup.zero_stage == 3) or setup.fsdp_strategy != "none":
        on_gpu = model_states(model, st, dataclasses.replace(setup, offload="none"), 0).weights
        if setup.offload == "optimizer+params":
            return 0.0, on_gpu * setup.gpus_per_node
        return on_gpu, 0.0
    if setup.uses_deepspeed:
        return st.total * (4.0 if setup.precision == "fp32" else 2.0), 0.0
    return st.total * (4.0 if setup.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2.0), 0.0


def reference_what(setup: TrainingSetup) -> str:
    what = "frozen DPO reference: a second copy of the base weights"
    dtype = "fp32" if setup.precision == "fp32" else "16-bit"
    if setup.uses_deepspeed and setup.zero_stage == 3:
        return what + f", {dtype} / {setup.shard_group} GPUs (ZeRO-3 partitions it like the policy)"
    if setup.fsdp_strategy != "none" and fsdp_shards(setup) > 1:
        return what + f" / {fsdp_shards(setup)} GPUs (FSDP shards it like the policy)"
    if setup.uses_deepspeed:
        return what + f", {dtype}, whole on every GPU (TRL prepares it with ZeRO stage 0)"
    return what


def weights_what(setup: TrainingSetup, model: ModelSpec, st) -> str:
    if setup.quant in PREQUANTISED:
        return quant_formats.describe(setup.quant)[0]
    rest = "fp32 (PEFT k-bit preparation)" if runtime_of(setup).kbit_upcast else "16-bit"
    head_q = runtime_of(setup).quantised_lm_head_params(model) > 0
    quantised, kept = ("linear weights and lm_head", "embeddings, norms") if head_q else (
        "linear weights", "embeddings, norms, lm_head")
    if quant_formats.experts_left_dense(st, setup):
        kept += ", fused MoE experts and routers"
    if setup.quant in ("nf4", "nf4-dq"):
        return f"{quantised} NF4 (0.5 B/param); {kept} in {rest}"
    if setup.quant == "int8":
        return f"{quantised} int8 (1 B/param); {kept} in {rest}"
    param_bytes = 4 if setup.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2
    if setup.fsdp_strategy != "none":
        shards = "" if setup.fsdp_strategy == "no-shard" else f" / {setup.shard_group} GPUs"
        return (f"params x {param_bytes} B{shards} (FSDP {setup.fsdp_strategy}: sharded flat parameters are "
                "the master copy)")
    if setup.zero_stage >= 1 and setup.precision.endswith("-mixed"):
        param_bytes = 2
    return f"params x {param_bytes} B" + (f" / {setup.num_gpus} GPUs (ZeRO-3)" if setup.zero_stage == 3 else "")


def quant_what(setup: TrainingSetup) -> str:
    if setup.quant in PREQUANTISED:
        return quant_formats.describe(setup.quant)[1]
    if setup.quant == "nf4":
        return "NF4 absmax: one fp32 per 64 weights (0.0625 B/param)"
    if setup.quant == "nf4-dq":
        return "double-quantised absmax: uint8 per 64 weights + fp32 per 256 blocks (0.0159 B/param)"
    return "LLM.int8 row scales: one fp32 per output row"
