"""Gradients: which of a training step's gradients are alive in each of its phases.

Peak timing: with gradient accumulation gradients stay alive through the next micro-batch's
forward; the lm_head's (or tied embedding's) gradient exists before any layer is recomputed; the
embedding backward builds a dense vocab x hidden gradient while every other one is alive.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.framework_effects import no_sync_gradient_bytes
from trainfit.core.memory.fsdp import flat_root_bytes, no_sync_applies
from trainfit.core.memory.states import States
from trainfit.core.memory.step import TrainingStep
from trainfit.core.runtime import SHARDED_STRATEGIES, runtime_of
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class Gradients:
    accumulated_bytes: float  # kept across accumulation micro-steps (0 without accumulation)
    embedding_temporary_bytes: float  # the embedding backward's dense vocab x hidden gradient(s)
    lm_head_bytes: float  # the lm_head (or tied embedding) gradient, made by the loss backward
    lm_head_apart: bool  # the lm_head gradient is held next to the accumulated ones (FSDP root unit)
    held_in_layer_backward_bytes: float  # alive through every layer's backward
    at_backward_end_bytes: float  # alive when backward ends (unsharded ones under no_sync)
    flat_root_bytes: float  # FSDP1: the root unit's concatenated flat gradient at the embedding
    per_layer_bytes: float  # one layer's gradient, arriving as its backward runs


def gradient_bytes(step: TrainingStep) -> Gradients:
    """The gradients of a training step, per device, by the time they are alive."""
    model, st, setup, states = step.model, step.stats, step.setup, step.states
    full, num_layers = step.full, step.num_layers
    accumulated = states.gradients if setup.grad_accum > 1 else 0.0
    if no_sync_applies(setup):
        # FSDP no_sync: unsharded gradients between micro-batches (runtime.Runtime.fsdp_no_sync)
        accumulated = no_sync_gradient_bytes(st, setup, states.trainable)
    grad_element_bytes = 4 if step.residual_bytes == 4 else 2
    embedding_temporary = (model.vocab_size * model.hidden_size * grad_element_bytes
                           * (2 if model.tie_embeddings else 1)) if full else 0.0
    # The lm_head (or tied embedding) gradient exists before any layer is recomputed.
    lm_head = (model.vocab_size * model.hidden_size * grad_element_bytes) if full else 0.0
    # Under FSDP the root unit (embeddings, lm_head) reduce-scatters only after the embedding's
    # backward, the last of the step: a trained lm_head's unsharded gradient is held next to the
    # sharded accumulated ones through every layer's backward (bench/fsdp_no_sync_cpu.py, sync). Under
    # FSDP2's no_sync it accumulates into the root's unsharded gradient, which `accumulated` already
    # holds; FSDP1 holds it apart either way, waiting for the root's other parts (flat_root_bytes).
    sharded = full and setup.fsdp_strategy in SHARDED_STRATEGIES
    flat = sharded and runtime_of(setup).fsdp_flat_params
    lm_head_apart = sharded and (flat or not no_sync_applies(setup))
    held = accumulated + lm_head if lm_head_apart else max(accumulated, lm_head)
    # FSDP1 at the embedding's backward: the lm_head's gradient, the embedding's and their
    # concatenation into the root's flat gradient, all at once (bench/fsdp_flat_root_cpu.py).
    root = flat_root_bytes(st, setup, lm_head if not model.tie_embeddings else 0.0) if flat else 0.0
    # A layer's gradient arrives with its backward (none to count when they accumulate anyway, or
    # when the optimizer steps each parameter in backward).
    per_layer = 0.0 if accumulated or setup.optimizer_in_backward or not num_layers else (
        states.gradients * (st.per_layer / st.total if full and st.total else 1.0 / num_layers))
    return Gradients(accumulated, embedding_temporary, lm_head, lm_head_apart, held,
                     max(states.gradients, accumulated), root, per_layer)


def gradients_what(setup: TrainingSetup, states: States, *, at_step: bool) -> str:
    if setup.optimizer_in_backward:
        return "optimizer in backward: at most the largest parameter's gradient alive"
    if no_sync_applies(setup) and not at_step:
        return ("unsharded gradients of every trained FSDP unit, kept across accumulation micro-steps "
                "(FSDP no_sync: no reduce-scatter until the last micro-batch)")
    why = "alive at the optimizer step" if setup.grad_accum == 1 else "kept across accumulation micro-steps"
    shard = f" / {setup.shard_group} GPUs (ZeRO-{setup.zero_stage})" if (
        setup.uses_deepspeed and setup.zero_stage >= 2 and setup.shard_group > 1) else ""
    return f"gradients of {states.trainable:,} trainable params{shard} ({why})"
