"""The components a training estimate lists: what is alive at the phase of its tensor peak.

phases.py finds the peak's phase; this module names each component alive there, with a line on
what it is and how it was counted.
"""

from __future__ import annotations

from trainfit.core.memory.fsdp import gathered_what
from trainfit.core.memory.gradients import gradients_what
from trainfit.core.memory.optimizer_states import optimizer_what
from trainfit.core.memory.phases import PhasePeaks, TrainingParts
from trainfit.core.memory.states import trained_param_bytes
from trainfit.core.memory.step import TrainingStep
from trainfit.core.memory.weights import quant_what, reference_what, weights_what
from trainfit.core.memory_types import MemoryComponent as C
from trainfit.core.runtime import runtime_of


def peak_components(step: TrainingStep, parts: TrainingParts, peaks: PhasePeaks) -> list[C]:
    """The components alive at the tensor peak: the states every phase holds, then what the peak's
    phase adds (activations, loss, transients)."""
    comps = resident_components(step, parts, peaks)
    where = peaks.peak_phase
    if where in ("optimizer step", "backward end"):
        return comps
    if where == "reference forward":
        comps.append(C("reference_forward", int(parts.transients.reference_forward_bytes),
                       "reference logits (2*b*s*vocab) + one layer's temporaries, no_grad", True))
        return comps
    if where == "layer backward":
        return comps + layer_backward_components(step, parts, peaks)
    return comps + forward_components(step, parts, peaks)


def resident_components(step: TrainingStep, parts: TrainingParts, peaks: PhasePeaks) -> list[C]:
    """Weights, optimizer states, gathered shards and buckets, and the gradients and step
    temporaries of the peak's phase."""
    model, st, setup, states = step.model, step.stats, step.setup, step.states
    where, grads = peaks.peak_phase, parts.gradients
    comps = [C("weights", int(states.weights), weights_what(setup, model, st), True)]
    if states.quant_overhead:
        comps.append(C("quant_overhead", int(states.quant_overhead), quant_what(setup), True))
    if states.lora:
        per = trained_param_bytes(setup)
        dtype = "fp32" if per == 4 else "16-bit, LitGPT's bf16-true"
        comps.append(C("lora", int(states.lora),
                       f"adapters r={setup.lora.rank}: {states.trainable:,} params x {per} B ({dtype})", True))
    if parts.reference_bytes:
        comps.append(C("reference_model", int(parts.reference_bytes), reference_what(setup), True))
    if states.master_weights:
        comps.append(C("master_weights", int(states.master_weights),
                       "fp32 master copy (4 B/param, sharded by ZeRO)", True))
    if states.optimizer:
        comps.append(C("optimizer", int(states.optimizer), optimizer_what(setup), True))
    if peaks.gathered[where] and setup.fsdp_strategy != "none":
        comps.append(C("fsdp_gathered", int(peaks.gathered[where]), gathered_what(st, setup, where), True))
    elif states.gathered:
        comps.append(C("zero3_gathered", int(states.gathered),
                       "ZeRO-3: current + prefetched decoder block, 16-bit", True))
    if states.buckets:
        comps.append(C("grad_buckets", int(states.buckets),
                       "DDP flat gradient buckets / ZeRO reduce bucket (hidden^2)", True))
    kept = parts.transients.kept_output_bytes
    if kept and where not in ("forward", "reference forward"):
        comps.append(C("kept_output", int(kept), "the model output's logits, kept by the training loop until "
                       "after the optimizer step", True))
    at_step = where == "optimizer step"
    grads_at_peak = {"optimizer step": states.gradients, "backward end": grads.at_backward_end_bytes}.get(
        where, grads.accumulated_bytes)
    if grads_at_peak:
        comps.append(C("gradients", int(grads_at_peak), gradients_what(setup, states, at_step=at_step), True))
    if where == "optimizer step" and parts.optimizer.step_temporary_bytes:
        comps.append(C("optimizer_step_temporary", int(parts.optimizer.step_temporary_bytes),
                       "foreach AdamW: sqrt of every second moment at once (torch._foreach_sqrt), one moment's "
                       "size", True))
    if where == "backward end":
        comps.append(C("embedding_grad", int(grads.embedding_temporary_bytes),
                       "dense vocab x hidden grad of the embedding backward", True))
        if grads.flat_root_bytes:
            comps.append(C("fsdp_root_gradient", int(grads.flat_root_bytes), "FSDP1: the root unit's flat "
                           "gradient concatenated from its parts, with the lm_head's gradient that waited for it",
                           True))
    return comps


def layer_backward_components(step: TrainingStep, parts: TrainingParts, peaks: PhasePeaks) -> list[C]:
    """What a layer's backward adds at the peak: the activations left, the autocast cache, the
    lm_head's gradient and the gradients of the layers whose backward ran first."""
    setup, num_layers, done_layers = step.setup, step.num_layers, peaks.done_layers
    acts, grads = parts.activations, parts.gradients
    held_what = (f" + {num_layers - 1} layer-input gradients held by FSDP's reshard hooks"
                 if acts.held_input_grads_bytes else "")
    left = acts.saved_layers_bytes * (num_layers - done_layers) / num_layers
    comps = [C("activations", int(left + acts.held_input_grads_bytes + acts.final_bytes + acts.recompute_bytes),
               acts.what + held_what + (f"; {done_layers} layer(s) done (their backward ran)" if done_layers
                                        else ""), True)]
    if acts.autocast_cache_bytes:
        comps.append(C("autocast_weight_cache", int(acts.autocast_cache_bytes),
                       "autocast's 16-bit copies of trained weights", True))
    if grads.lm_head_apart and grads.accumulated_bytes:
        comps.append(C("lm_head_gradient", int(grads.lm_head_bytes), "lm_head gradient, unsharded until the "
                       "FSDP root unit's reduce-scatter at the end of backward", True))
    elif not grads.accumulated_bytes and grads.lm_head_bytes:
        comps.append(C("gradients", int(grads.lm_head_bytes), "lm_head gradient, alive before layers recompute",
                       True))
    if done_layers and grads.per_layer_bytes:
        comps.append(C("finished_layer_gradients", int(done_layers * grads.per_layer_bytes),
                       f"gradients of the {done_layers} layer(s) whose backward ran first"
                       + (" (sharded, back from their reduce-scatter)" if setup.shard_group > 1 and
                          setup.zero_stage >= 2 else ""), True))
    return comps


def forward_components(step: TrainingStep, parts: TrainingParts, peaks: PhasePeaks) -> list[C]:
    """What the forward or the loss backward adds at the peak: activations, the autocast cache,
    logits and loss, and the transients of that phase."""
    setup, where = step.setup, peaks.peak_phase
    acts, loss, tmp = parts.activations, parts.loss, parts.transients
    comps = [C("activations", int(acts.saved_layers_bytes + acts.final_bytes), acts.what, True)]
    if acts.autocast_cache_bytes:
        comps.append(C("autocast_weight_cache", int(acts.autocast_cache_bytes),
                       "autocast's 16-bit copies of trained weights: 2 B/param", True))
    loss_extra = loss.forward if where == "forward" else loss.backward
    comps.append(C("logits", int(loss.saved + loss_extra), loss.what, True))
    if tmp.dequant_bytes:
        comps.append(C("dequant_transient", int(tmp.dequant_bytes), "largest quantised weight de-quantised to "
                       "16-bit" + (" (fp16, and its bf16 cast)" if runtime_of(setup).dequant_copies == 2 else ""),
                       True))
    if tmp.dora_bytes and where == "forward":
        comps.append(C("dora_transient", int(tmp.dora_bytes), "DoRA: B@A, the cast weight and W + s*BA of the "
                       "largest adapted layer (its forward)", True))
    if tmp.kv_cache_bytes and where == "forward":
        comps.append(C("kv_cache", int(tmp.kv_cache_bytes), f"key/value cache of {step.num_layers} checkpointed "
                       "layers (use_cache left on before transformers 4.53), each a view keeping its whole c_attn "
                       "output", True))
    if tmp.previous_step_bytes and where == "forward":
        comps.append(C("previous_step", int(tmp.previous_step_bytes), "the previous micro-step's logits"
                       + (" and the inputs bitsandbytes kept on its autograd ctx"
                          if runtime_of(setup).previous_has_inputs else "")
                       + ", held by the loop's names until this forward returns", True))
    return comps
