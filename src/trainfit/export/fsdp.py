"""FSDP settings at the ZeRO-equivalent stage, in the two forms the tools take.

ZeRO-3 = FULL_SHARD (parameters re-sharded after each forward); ZeRO-0/1/2 = SHARD_GRAD_OP
(parameters kept gathered between forward and backward; FSDP always shards optimizer state and
gradients, so there is no "no shard" stage here). `offload` other than none moves parameters
(and with them gradients and optimizer state) to the CPU.

training.fsdp_strategy (full-shard / shard-grad-op) arrives here as its ZeRO-equivalent stage: the
run config requires zero_stage 3 / 2 beside it (trainfit.core.knob_rules), so the stage keeps
being the one input. no-shard is refused there (DDP runs it), so NO_SHARD is never written.

* `fsdp_arguments`: the TrainingArguments keys. Transformers 5 takes FSDP2 through `fsdp=True` +
  `fsdp_config` (the string form is deprecated there); 4.x takes the string form (FSDP1).
* `accelerate_fsdp_block`: the same settings as the `fsdp_config` block of an Accelerate config
  file, so `accelerate launch` sets the same plugin the Trainer builds from the arguments.

Hybrid sharding across nodes (`hybrid_replicas` = nodes > 1, ZeRO-3 equivalent only): FSDP1 takes
the HYBRID_SHARD strategy ("hybrid_shard" in TrainingArguments' string form); FSDP2 builds it from
a 2-D device mesh, which Accelerate takes as its parallelism_config (trainfit.export.accelerate_config).
"""

from __future__ import annotations

from typing import Any

# Accelerate's names (accelerate.utils.constants): wrap each transformer block (the model's
# `_no_split_modules`), and gather a full state dict when saving, as Transformers defaults to.
AUTO_WRAP_POLICY = "TRANSFORMER_BASED_WRAP"
STATE_DICT_TYPE = "FULL_STATE_DICT"


def full_shard(zero_stage: int) -> bool:
    """True when parameters are re-sharded after each forward (ZeRO-3 equivalent)."""
    return zero_stage >= 3


def fsdp_arguments(zero_stage: int, offload: bool, *, transformers_major: int,
                   hybrid_replicas: int = 1) -> dict[str, Any]:
    """TrainingArguments keys for FSDP at the ZeRO-equivalent stage."""
    reshard = full_shard(zero_stage)
    if transformers_major >= 5:
        return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": reshard,
                                              "cpu_offload": offload}}
    shard = "full_shard" if reshard else "shard_grad_op"
    if reshard and hybrid_replicas > 1:
        shard = "hybrid_shard"
    return {"fsdp": f"{shard} auto_wrap" + (" offload" if offload else ""), "fsdp_config": {"use_orig_params": True}}


def accelerate_fsdp_block(zero_stage: int, offload: bool, *, transformers_major: int,
                          hybrid_replicas: int = 1) -> dict[str, Any]:
    """The `fsdp_config` block of an Accelerate config file with the same settings."""
    reshard = full_shard(zero_stage)
    block: dict[str, Any] = {
        "fsdp_auto_wrap_policy": AUTO_WRAP_POLICY,
        "fsdp_offload_params": offload,
        "fsdp_state_dict_type": STATE_DICT_TYPE,
        "fsdp_cpu_ram_efficient_loading": False,  # every rank builds the model, as trainfit train does
        "fsdp_activation_checkpointing": False,  # checkpointing is the model's (training.grad_checkpointing)
    }
    if transformers_major >= 5:
        block.update({"fsdp_version": 2, "fsdp_reshard_after_forward": reshard})
    else:
        # FSDP1 takes the sharding strategy by name in the same key.
        strategy = "FULL_SHARD" if reshard else "SHARD_GRAD_OP"
        if reshard and hybrid_replicas > 1:
            strategy = "HYBRID_SHARD"
        block.update({"fsdp_version": 1, "fsdp_reshard_after_forward": strategy,
                      "fsdp_use_orig_params": True, "fsdp_sync_module_states": True})
    return block
