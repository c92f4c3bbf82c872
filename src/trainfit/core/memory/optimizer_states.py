"""Optimizer states: the optimizer's moments, the fp32 master weights, and the step's temporary.

states.model_states works out the per-device bytes of the states (optimizer, dtype, sharding,
offload, paging); this module adds what the optimizer step allocates on top of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.framework_effects import step_temporary_bytes
from trainfit.core.memory.states import trained_param_bytes
from trainfit.core.memory.step import TrainingStep
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class OptimizerStates:
    optimizer_bytes: float  # the optimizer's states (moments), after sharding and offload
    master_weights_bytes: float  # the fp32 master copy of 16-bit trained weights (ZeRO's)
    step_temporary_bytes: float  # what the optimizer step allocates next to the states


def optimizer_state_bytes(step: TrainingStep) -> OptimizerStates:
    """The optimizer's states on each device, and the temporary of its step: torch's foreach AdamW
    takes the square root of every second moment at once, one moment-sized tensor (runtime.Runtime)."""
    states = step.states
    return OptimizerStates(states.optimizer, states.master_weights,
                           step_temporary_bytes(step.setup, states.optimizer))


def optimizer_what(setup: TrainingSetup) -> str:
    shard = f" / {setup.num_gpus} (ZeRO-{setup.zero_stage})" if setup.zero_stage >= 1 else ""
    if setup.fsdp_strategy != "none":
        shard = "" if setup.fsdp_strategy == "no-shard" else f" / {setup.shard_group} (FSDP {setup.fsdp_strategy})"
    adamw = ("(8 B/param fp32)" if trained_param_bytes(setup) == 4
             else "(4 B/param: 16-bit moments of 16-bit parameters)")
    return {
        "adamw": f"AdamW: 2 moments x param dtype {adamw}",
        "adamw-8bit": "8-bit AdamW: 2 x (1 B + fp32 absmax per 256) per param",
        "paged-adamw-8bit": "paged 8-bit AdamW: 2 x (1 B + fp32 absmax per 256) per param",
        "paged-adamw-32bit": "paged 32-bit AdamW (bitsandbytes): 2 fp32 moments (8 B/param), pageable to CPU RAM",
        "sgd": "SGD: no state",
        "sgd-momentum": "SGD momentum buffer: 1 x param dtype",
        "adafactor": "Adafactor: factored second moments (rows + cols per matrix)",
        "lion": "Lion: 1 momentum x param dtype",
    }[setup.optimizer] + shard
