"""Activations: the tensors autograd saves from a training step's forward for its backward.

layer_activations.py counts what one decoder layer saves per token; this module turns that into the
step's bytes under gradient checkpointing and activation offloading, adds what the model saves
outside its layers (final norm, lm_head input, vision tower) and autocast's cache of 16-bit weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory import activations as act
from trainfit.core.memory import model_dropout, vision
from trainfit.core.memory.knob_effects import offload_activations
from trainfit.core.memory.layer_activations import layer_bytes_per_token
from trainfit.core.memory.step import TrainingStep
from trainfit.core.memory_types import MemoryComponent
from trainfit.core.runtime import runtime_of


@dataclass(frozen=True)
class SavedActivations:
    layer_bytes_per_token: float  # what one decoder layer saves per token
    layer_bytes: float  # what one decoder layer saves for the micro-batch (eager scores included)
    saved_layers_bytes: float  # what all layers keep for backward (checkpoints, or all of it)
    recompute_bytes: float  # one layer recomputed at a time under full checkpointing
    final_bytes: float  # saved outside the layers: final norm, lm_head input, vision tower
    held_input_grads_bytes: float  # layer-input gradients FSDP's reshard hooks hold to backward's end
    autocast_cache_bytes: float  # autocast's 16-bit copies of the trained weights
    what: str  # how the layers' activations are kept
    host: MemoryComponent | None  # pinned CPU memory of activation offloading
    note: str | None  # a note on the held layer-input gradients


def activation_bytes(step: TrainingStep) -> SavedActivations:
    """The activations of a training step: each layer's saved tensors under the setup's gradient
    checkpointing, offloaded to pinned CPU memory when asked, and what the model saves outside them."""
    model, setup, tokens = step.model, step.setup, step.tokens
    num_layers, residual_bytes = step.num_layers, step.residual_bytes
    per_token, core = layer_bytes_per_token(model, step.stats, setup, step.lora_where)
    scores = act.eager_scores_bytes(model, setup, tokens, setup.seq_len)
    layer = per_token * tokens + scores
    recompute = 0.0
    if setup.grad_checkpointing == "full":
        # One hidden-state input per layer kept; one layer recomputed at a time during backward.
        saved_layers = num_layers * residual_bytes * model.hidden_size * tokens
        recompute = layer
        what = (f"full checkpointing: {num_layers} layer inputs (b*s*h*{residual_bytes} B) + one layer "
                "recomputed")
    elif setup.grad_checkpointing == "selective":
        saved_layers = num_layers * (layer - core * tokens - scores) + (core * tokens + scores)
        what = "selective checkpointing: attention core recomputed, one layer's core alive"
    else:
        saved_layers = num_layers * layer
        what = f"{num_layers} layers x {per_token:.0f} B/token x {tokens} tokens" + (
            " + eager scores" if scores else "")
    dropout = max(model.hidden_dropout, model.attention_dropout, model.embedding_dropout)
    if dropout and model_dropout.runs(model, setup):
        what += f"; with the model's own dropout (p={dropout:g} in its config: masks kept for backward)"
    input_grads, note = held_input_gradient_bytes(step)
    host = None
    if setup.activation_offload:
        saved_layers, host = offload_activations(saved_layers, num_layers, setup)
        what += "; offloaded to pinned CPU memory, 2 layers' worth on the GPU"
    final = act.final_norm_bytes_per_token(model, setup, step.full) * tokens
    final += vision.tower_saved_bytes(model, setup, step.sequences)
    return SavedActivations(per_token, layer, saved_layers, recompute, final, input_grads,
                            autocast_cache_bytes(step), what, host, note)


def held_input_gradient_bytes(step: TrainingStep) -> tuple[float, str | None]:
    """(bytes, note) of the layer-input gradients held to the end of backward: reentrant checkpoints
    around frozen FSDP units hold each layer's input gradient too, up to the last layer's recompute
    (runtime.Runtime.held_layer_input_grads)."""
    if not runtime_of(step.setup).held_layer_input_grads:
        return 0.0, None
    held = (step.num_layers - 1) * step.residual_bytes * step.model.hidden_size * step.tokens
    if not held:
        return held, None
    return held, (f"transformers < 4.52 checkpoints each FSDP unit's call (reentrant): FSDP's reshard hooks "
                  f"hold every layer's input gradient until backward ends ({held / 2**30:.2f} GiB); "
                  "gradient_checkpointing_kwargs={'use_reentrant': False} or transformers >= 4.52 avoids it")


def autocast_cache_bytes(step: TrainingStep) -> float:
    """Autocast caches the 16-bit copy of every trained weight that a matmul reads, for the whole
    forward. Under FSDP and DeepSpeed no autocast casts the model's own weights
    (act.engine_runs_autocast), so there is no cache (FSDP's 16-bit gathered layers are counted in its
    gather floor). Fused MoE experts run as a grouped matmul autocast does not cast
    (activations.expert_weight_bytes): no 16-bit copy of them exists (measured on CPU: Mixtral under
    bf16 autocast +4.5 % -> exact)."""
    st, setup = step.stats, step.setup
    uncast = st.experts if runtime_of(setup).experts_fused else 0
    return 2.0 * (st.linear - uncast + (st.lm_head or st.embedding)) if (
        step.autocast and step.full and act.engine_runs_autocast(setup)) else 0.0
