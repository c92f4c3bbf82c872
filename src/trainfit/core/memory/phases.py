"""The one place a training step's components are added up: the bytes alive in each phase.

Peak timing (where other calculators go wrong):
* the loss backward (grad of log_softmax + grad of logits) happens while every saved activation
  is still alive;
* the first optimizer step allocates the states while all gradients are alive;
* with gradient accumulation gradients stay alive through the next micro-batch's forward;
* under autocast, the 16-bit copies of trained weights are cached for the whole forward and
  kept by autograd until each layer's backward.
The tensor peak is the largest of the phase peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.fsdp import gathered_by_phase
from trainfit.core.memory.gradients import Gradients, gradient_bytes
from trainfit.core.memory.loss import loss_bytes
from trainfit.core.memory.loss_kernels import LossTerms
from trainfit.core.memory.optimizer_states import OptimizerStates, optimizer_state_bytes
from trainfit.core.memory.overheads import ACTIVATION_PHASES, STEP_PHASES, phase_pool_bytes
from trainfit.core.memory.saved_activations import SavedActivations, activation_bytes
from trainfit.core.memory.step import TrainingStep
from trainfit.core.memory.transients import Transients, transient_bytes
from trainfit.core.memory.weights import reference_model_bytes, weights_bytes

PEAK_NOTE = "tensor peak at the "  # the note that names the phase of the tensor peak


@dataclass(frozen=True)
class TrainingParts:
    """Every component of a training step, each from its own function."""

    weights_bytes: float
    reference_bytes: float  # DPO's frozen reference model on each GPU
    reference_host_bytes: float  # and on the host, when offloaded
    optimizer: OptimizerStates
    gradients: Gradients
    activations: SavedActivations
    loss: LossTerms
    transients: Transients


def training_parts(step: TrainingStep) -> TrainingParts:
    """The components of `step`, one function each."""
    reference, reference_host = reference_model_bytes(step)
    activations = activation_bytes(step)
    return TrainingParts(weights_bytes(step), reference, reference_host, optimizer_state_bytes(step),
                         gradient_bytes(step), activations, loss_bytes(step),
                         transient_bytes(step, activations.layer_bytes))


@dataclass(frozen=True)
class PhasePeaks:
    phases: dict[str, float]  # bytes alive at each phase's peak
    gathered: dict[str, float]  # what sharding holds gathered in each phase
    peak_phase: str  # the phase of the tensor peak
    done_layers: int  # layers whose backward ran before the layer-backward phase's peak
    pool_bytes: float  # what the caching allocator holds across phases (overheads.margins)
    note: str  # names the peak's phase and lists every phase


def phase_peaks(step: TrainingStep, parts: TrainingParts) -> PhasePeaks:
    """The bytes alive at the peak of each phase of the step, and the phase of the largest."""
    states, optimizer, grads = step.states, parts.optimizer, parts.gradients
    acts, loss, tmp = parts.activations, parts.loss, parts.transients
    base = (parts.weights_bytes + parts.reference_bytes + optimizer.optimizer_bytes
            + optimizer.master_weights_bytes + states.buckets)
    # What sharding holds gathered in each phase: FSDP's changes through the step (fsdp.gathered_by_phase);
    # ZeRO-3's current and prefetched block are counted in every phase.
    gathered = gathered_by_phase(step.stats, step.setup) or dict.fromkeys(
        ACTIVATION_PHASES + STEP_PHASES + ("first layer backward",), states.gathered)
    saved = acts.saved_layers_bytes + acts.final_bytes + acts.autocast_cache_bytes
    accumulated, kept = grads.accumulated_bytes, tmp.kept_output_bytes
    phases = {
        "forward": (saved + loss.saved + loss.forward + tmp.dequant_bytes + tmp.dora_bytes
                    + tmp.previous_step_bytes + tmp.kv_cache_bytes + accumulated),
        "loss backward": (saved + loss.saved + loss.backward + tmp.dequant_bytes + kept
                          + tmp.kept_kv_cache_bytes + accumulated),
        "optimizer step": states.gradients + optimizer.step_temporary_bytes + kept + tmp.kept_kv_cache_bytes,
        # The embedding backward (embedding_dense_backward) builds a dense vocab x hidden grad
        # while every other grad is alive; tied embeddings add it to the lm_head's grad in place
        # (measured on CPU: two such tensors for tied, one for untied).
        "backward end": (grads.at_backward_end_bytes + grads.embedding_temporary_bytes + grads.flat_root_bytes
                         + kept),
        "layer backward": (grads.held_in_layer_backward_bytes + acts.saved_layers_bytes
                           + acts.held_input_grads_bytes + acts.final_bytes + acts.recompute_bytes
                           + acts.autocast_cache_bytes + kept),
        "reference forward": tmp.reference_forward_bytes + accumulated,
    }
    phases = {name: base + gathered[name] + more for name, more in phases.items()}
    first_layer = phases["layer backward"] - gathered["layer backward"] + gathered["first layer backward"]
    peak_layer = max(sorted({1, 2, step.num_layers} if step.num_layers > 1 else {1}),
                     key=lambda k: layer_backward_bytes(step, parts, gathered, first_layer, k))
    phases["layer backward"] = layer_backward_bytes(step, parts, gathered, first_layer, peak_layer)
    done_layers = peak_layer - 1
    if not done_layers:
        gathered["layer backward"] = gathered["first layer backward"]
    peak_phase = max(phases, key=phases.get)
    note = (f"{PEAK_NOTE}{peak_phase}; phases (GiB): "
            + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in phases.items()))
    pool = phase_pool_bytes(phases, resident=base + min(gathered.values()) + accumulated)
    return PhasePeaks(phases, gathered, peak_phase, done_layers, pool, note)


def layer_backward_bytes(step: TrainingStep, parts: TrainingParts, gathered: dict[str, float],
                         first_layer: float, k: int) -> float:
    """Bytes alive in the backward of the k-th layer from the last. The backward runs the layers last
    to first: before the k-th, k-1 layers' saved tensors (or checkpoints) are gone and their gradients
    have arrived (sharded under ZeRO / FSDP; FSDP2 then also holds a second layer's unsharded gradient,
    fsdp.gathered_by_phase). The phase is linear in k from the second layer on, so it is at its most at
    the first, second or last layer: the last where a layer's gradient outweighs what it saved, as in a
    checkpointed full fine-tune (measured on CPU: bench/fsdp_phases_cpu.py,
    tests/memory/test_layer_backward.py)."""
    if k == 1:
        return first_layer
    saved_layers, num_layers = parts.activations.saved_layers_bytes, step.num_layers
    return (first_layer - gathered["first layer backward"] + gathered["layer backward"]
            - (k - 1) * saved_layers / num_layers + (k - 1) * parts.gradients.per_layer_bytes)


def peak_phase(notes: list[str]) -> str | None:
    """The phase the estimate puts the tensor peak in (its note), None for estimates without phases."""
    return next((n.split(";")[0].removeprefix(PEAK_NOTE) for n in notes if n.startswith(PEAK_NOTE)), None)
