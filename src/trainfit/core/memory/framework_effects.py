"""Memory that depends on which framework (and which version of it) runs a setup.

The behaviours themselves, with their sources and measurements, are read once into the runtime
record (trainfit.core.runtime, `runtime_of`), which the speed model reads too; this module turns the
ones that hold tensors into bytes: foreach AdamW's step temporary, FSDP no_sync's unsharded
gradients, the key/value cache a checkpointed forward keeps, and the logits the forward returns.
"""

from __future__ import annotations

from trainfit.core.memory.fsdp import compute_bytes, root_params
from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup

__all__ = ["cached_kv_bytes_per_token", "no_sync_gradient_bytes", "returned_logits_bytes",
           "step_temporary_bytes"]


def step_temporary_bytes(setup: TrainingSetup, optimizer_bytes: float) -> float:
    """Bytes a foreach AdamW step allocates on top of the states: one of the two moments, per device
    (optimizer_bytes is what the device holds, after sharding and offload)."""
    return optimizer_bytes / 2 if runtime_of(setup).foreach_step_temporary else 0.0


def no_sync_gradient_bytes(st: ModelStats, setup: TrainingSetup, trainable: int) -> float:
    """Unsharded gradients each GPU keeps across accumulation micro-steps under FSDP no_sync: every
    unit that trains, whole. Full training: every parameter, in the gathered (compute) dtype;
    adapters inside their frozen layer's unit: every decoder weight; adapters in units of their own
    (PEFT's wrap policy): the adapters alone, fp32."""
    if not setup.trains_adapters:
        return float(st.total * compute_bytes(setup))
    if runtime_of(setup).fsdp_mixed_units:
        return float((st.total - root_params(st)) * compute_bytes(setup))
    return trainable * 4.0


def cached_kv_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, c_attn_bytes: int) -> float:
    """Bytes per token that the key/value cache of a checkpointed run keeps through the forward
    (cache_under_checkpointing): in every layer the whole fused c_attn output (queries, keys and
    values) its key/value view belongs to, in the dtype the projection returns. The model's output
    holds the cache; the HF Trainer drops that output before backward."""
    if not runtime_of(setup).kv_cache_kept(spec):
        return 0.0
    width = spec.num_heads * spec.head_dim + 2 * spec.num_kv_heads * spec.head_dim
    return spec.num_layers * width * c_attn_bytes


def returned_logits_bytes(spec: ModelSpec, setup: TrainingSetup, compute_bytes: int) -> int:
    """Bytes per token of the logits the model's forward returns."""
    return (4 if runtime_of(setup).logits_upcast_by_forward(spec) else compute_bytes) * spec.vocab_size
