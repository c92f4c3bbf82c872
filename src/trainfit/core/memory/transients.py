"""Transients: tensors that live for part of one phase of a training step, or that the training
loop keeps around between phases.

De-quantised weights and DoRA's weight-norm temporaries exist one layer at a time; the DPO
reference's forward holds its logits; a loop that keeps the model's output holds its logits (and a
key/value cache) through backward and the step; a loop whose names hold the previous micro-step's
output keeps it through the next forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory import activations as act
from trainfit.core.memory import dora
from trainfit.core.memory.framework_effects import cached_kv_bytes_per_token, returned_logits_bytes
from trainfit.core.memory.step import TrainingStep
from trainfit.core.runtime import BNB_QUANTS, runtime_of


@dataclass(frozen=True)
class Transients:
    dequant_bytes: float  # the largest frozen weight de-quantised (or cast) to 16 bits
    dora_bytes: float  # DoRA's weight-norm temporaries of the largest adapted layer (forward)
    reference_forward_bytes: float  # DPO's no_grad reference forward: logits + one layer's temps
    kept_output_bytes: float  # the model output's logits, kept by the loop until after the step
    previous_step_bytes: float  # the previous micro-step's output, alive through this forward
    kv_cache_bytes: float  # the key/value cache a checkpointed forward returns
    kept_kv_cache_bytes: float  # that cache, held by a kept output through backward and the step


def transient_bytes(step: TrainingStep, layer_bytes: float) -> Transients:
    """The transients of a training step; `layer_bytes` is what one decoder layer saves for the
    micro-batch (SavedActivations.layer_bytes), the reference forward's temporaries are half of it."""
    model, setup, tokens, compute_bytes = step.model, step.setup, step.tokens, step.compute_bytes
    # Reference forward (no_grad) of DPO: logits for all chosen+rejected tokens, one layer's temps.
    reference_forward = 0.0
    if step.dpo and setup.dpo_reference != "precomputed":
        reference_forward = compute_bytes * model.vocab_size * tokens + layer_bytes / 2
    # A loop that keeps the model's output holds its logits from the loss to the step.
    runtime = runtime_of(setup)
    kept = (returned_logits_bytes(model, setup, compute_bytes) * tokens if runtime.output_kept and not step.dpo
            else 0.0)
    # The key/value cache a checkpointed forward returns (framework_effects.cached_kv_bytes_per_token):
    # 4-bit linears return their input's dtype, the stream's, others the compute dtype.
    c_attn_bytes = step.residual_bytes if setup.quant in BNB_QUANTS else compute_bytes
    kv_cache = cached_kv_bytes_per_token(model, setup, c_attn_bytes) * tokens
    return Transients(
        # Frozen quantised / 16-bit base: one weight de-quantised (or cast) at a time.
        dequant_bytes=step.states.dequant_transient,
        # DoRA's weight-norm temporaries exist only inside a layer's forward, one layer at a time.
        dora_bytes=dora.forward_transient_bytes(model, setup),
        reference_forward_bytes=reference_forward,
        kept_output_bytes=kept,
        previous_step_bytes=act.previous_step_bytes(model, step.stats, setup, compute_bytes, tokens),
        kv_cache_bytes=kv_cache,
        kept_kv_cache_bytes=kv_cache if runtime.output_kept else 0.0,  # the kept output holds its cache too
    )
