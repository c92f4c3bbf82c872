"""PyTorch FSDP model states per GPU, with FSDP's real floor instead of total / N.

What FSDP keeps (https://pytorch.org/docs/stable/fsdp.html, FullyShardedDataParallel,
MixedPrecision, BackwardPrefetch; FSDP2: https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html):
* the flat parameters sharded in their original dtype (fp32 under mixed precision: they are the
  optimizer's master weights, no separate copy), their gradients sharded in the same dtype, the
  optimizer states of the shard;
* each wrapped unit (trainfit wraps every decoder layer, TRANSFORMER_BASED_WRAP) all-gathered in the
  compute dtype (MixedPrecision.param_dtype) while it runs. With the default
  BackwardPrefetch.BACKWARD_PRE (and forward prefetch / FSDP2's implicit prefetch) the next unit's
  all-gather is issued while the current one computes, so two layers are unsharded at once. A
  quantised base (FSDP QLoRA) is gathered as its packed storage, not in 16 bits (unit_bytes);
* the root unit (embeddings, final norm, lm_head: everything not inside a decoder layer) stays
  gathered from its forward to its backward (FSDP does not reshard the root after forward);
* in backward, one unit's unsharded gradient before reduce-scatter, in MixedPrecision.reduce_dtype.
  PyTorch: reduce_dtype None with a param_dtype set reduces in the compute dtype; no policy at all
  keeps everything in the parameters' dtype (fp32). Accelerate (which the HF Trainer uses) sets
  MixedPrecision(param_dtype=bf16, reduce_dtype=bf16) for mixed_precision bf16
  (accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision, v1.15.0), so
  gradients are reduced in 16 bits there; a policy with reduce_dtype=fp32 adds 2 B x layer (not a
  trainfit knob: the exporters write Accelerate's default).
* SHARD_GRAD_OP keeps the gathered parameters from forward to backward: the whole model unsharded
  in the compute dtype at the backward, plus the sharded fp32 states.
* NO_SHARD is DDP's memory (all states replicated), with the low-precision compute copy of the
  flat parameters under mixed precision and the gradients all-reduced in place (no DDP buckets).
* CPUOffload(offload_params=True) moves the sharded parameters, their gradients and the optimizer
  step to the CPU; the GPU keeps only the gathered units and the gradient being reduced.
"""

from __future__ import annotations

from trainfit.core.memory.quant_formats import quantised_linear_params, stored_bytes_per_param
from trainfit.core.memory.stats import ModelStats
from trainfit.core.runtime import SHARDED_STRATEGIES, runtime_of
from trainfit.core.setup import TrainingSetup

# Strategies that shard parameters or gradients (NO_SHARD keeps DDP's memory).


def no_sync_applies(setup: TrainingSetup) -> bool:
    """Micro-batches accumulate unsharded FSDP gradients, no reduce-scatter until the last one
    (TrainingSetup.fsdp_no_sync; the gradient held: framework_effects.no_sync_gradient_bytes)."""
    return runtime_of(setup).fsdp_no_sync


def compute_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of the gathered (compute-dtype) parameters."""
    return 4 if setup.precision == "fp32" else 2


def root_params(st: ModelStats) -> int:
    """Parameters of FSDP's root unit: embeddings and the untied lm_head (the final norm is tiny)."""
    return st.embedding + st.lm_head


def flat_root_bytes(st: ModelStats, setup: TrainingSetup, head_grad: float) -> float:
    """FSDP1 at the end of backward: autograd builds the root unit's flat gradient by concatenating
    its parts (the split's backward) once the embedding's arrives, so the lm_head's gradient
    (`head_grad`, 0 when tied: the embedding's then holds both), which waited since the loss, and
    the concatenation of the whole root (in the compute dtype) are alive beside the embedding's."""
    return head_grad + root_params(st) * compute_bytes(setup)


def unit_bytes(st: ModelStats, setup: TrainingSetup) -> float:
    """Bytes of one decoder layer's gathered flat parameter. A quantised base is sharded and
    all-gathered as its packed storage (bitsandbytes' quant_storage in the compute dtype, as FSDP
    QLoRA requires; GPTQ / AWQ packed words): FSDP moves the stored bytes and the layer de-quantises
    one weight at a time (counted as the de-quantisation transient), so the unit is not 16-bit."""
    c = compute_bytes(setup)
    if setup.quant == "none" or not st.layers:
        return float(st.per_layer * c)
    linear = quantised_linear_params(st, setup) / st.layers
    return linear * stored_bytes_per_param(setup.quant) + (st.per_layer - linear) * c


def _reduce_gradient_bytes(st: ModelStats, setup: TrainingSetup) -> float:
    """One unit's unsharded gradient before reduce-scatter (reduce dtype = compute dtype, see above).
    A frozen base under LoRA has no gradient to reduce, unless the adapters share its units
    (TrainingSetup.fsdp_mixed_units: FSDP keeps gradients for the whole unit). Under no_sync
    accumulation it is part of the whole unsharded gradient counted with the gradients
    (framework_effects.no_sync_gradient_bytes; measured: bench/fsdp_no_sync_cpu.py)."""
    trains_base = not setup.trains_adapters or runtime_of(setup).fsdp_mixed_units
    return unit_bytes(st, setup) if trains_base and not no_sync_applies(setup) else 0.0


def gathered_by_phase(st: ModelStats, setup: TrainingSetup) -> dict[str, float] | None:
    """What FSDP holds gathered (unsharded parameters and the gradient being reduced) in each phase
    of the step (estimate.py's phases); None where it does not shard parameters.

    Full shard: the forward holds the root and the current and next decoder layer; the loss's
    backward the root and the last layer, whose all-gather is issued as backward begins (its
    buffer is alive before its parameters are); a layer's backward the root, the current and
    prefetched layer and the unsharded gradients being reduced (below); the embedding's backward, the
    last, the root and the first layer's gradient on its way to the reduce-scatter. After backward
    every unit is resharded, so the optimizer steps with nothing gathered. Measured with FSDP2 on
    CPU at an emulated world size (bench/fsdp_phases_cpu.py: at the loss backward's peak the root's
    parameters and one layer-sized all-gather buffer are alive, at a layer's backward two layers'
    gradients)."""
    if setup.fsdp_strategy not in SHARDED_STRATEGIES:
        return None
    c = compute_bytes(setup)
    layer = unit_bytes(st, setup)
    reduce_grad = _reduce_gradient_bytes(st, setup)
    # FSDP2 keeps the previous unit's reduce-scatter input (its whole gradient, flattened) alive
    # until the next unit's reduce (FSDPCommContext.reduce_scatter_states, one buffer by default:
    # set_reduce_scatter_max_input_buffers), so a layer's backward runs beside two layers'
    # gradients from the second layer's backward on ("first layer backward": the first has none
    # before it); FSDP1 frees its flat gradient once the reduce-scatter is issued.
    held_grads = reduce_grad if runtime_of(setup).fsdp_flat_params else 2 * reduce_grad
    if setup.fsdp_strategy == "full-shard":
        root = root_params(st) * c
        running = root + 2 * layer
        return {"forward": running, "reference forward": running, "loss backward": root + layer,
                "first layer backward": running + reduce_grad, "layer backward": running + held_grads,
                "backward end": root + reduce_grad, "optimizer step": 0.0}
    whole = st.total * c  # SHARD_GRAD_OP: gathered from forward to the end of backward
    return {"forward": whole, "reference forward": whole, "loss backward": whole,
            "first layer backward": whole + reduce_grad, "layer backward": whole + held_grads,
            "backward end": whole + reduce_grad, "optimizer step": 0.0}


def gathered_bytes(st: ModelStats, setup: TrainingSetup) -> float:
    """The unsharded parameters and gradient FSDP holds on each GPU at its most (per phase:
    gathered_by_phase)."""
    if setup.fsdp_strategy in SHARDED_STRATEGIES:
        return gathered_by_phase(st, setup)["layer backward"]
    if setup.fsdp_strategy == "no-shard" and setup.precision.endswith("-mixed"):
        return float(st.total * compute_bytes(setup))  # the compute copy of the flat parameters
    return 0.0


def gathered_what(st: ModelStats, setup: TrainingSetup, phase: str) -> str:
    """What gathered_by_phase holds in `phase`, in words."""
    c = compute_bytes(setup)
    if setup.fsdp_strategy == "no-shard":
        return f"FSDP NO_SHARD: {c}-byte compute copy of the flat parameters"
    held = {"full-shard": {
        "forward": "root unit (embeddings, lm_head) + current and next decoder layer",
        "reference forward": "root unit (embeddings, lm_head) + current and next decoder layer",
        "loss backward": "root unit (embeddings, lm_head) + the last decoder layer, prefetched for backward",
        "layer backward": "root unit (embeddings, lm_head) + current and prefetched decoder layer + the "
                          "unsharded gradient of one layer (FSDP1) or two (FSDP2: the previous one's reduce-scatter "
                          "input)",
        "backward end": "root unit (embeddings, lm_head) + one layer's unsharded gradient"},
        "shard-grad-op": dict.fromkeys(("forward", "reference forward", "loss backward"),
                                       "SHARD_GRAD_OP: every parameter, from forward to backward"),
    }[setup.fsdp_strategy].get(phase, "SHARD_GRAD_OP: every parameter + the unsharded gradients being reduced")
    return f"FSDP {held}, parameters in the {c}-byte compute dtype"


def fsdp_shards(setup: TrainingSetup) -> int:
    """Ranks FSDP splits the states over (NO_SHARD: none)."""
    return 1 if setup.fsdp_strategy == "no-shard" else setup.shard_group
