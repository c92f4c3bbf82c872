"""Run-config refusals for the sharding / offload knobs: what `trainfit train` can run.

* training.fsdp_strategy: full-shard / shard-grad-op run under distributed.strategy fsdp, with
  training.zero_stage holding the equivalent stage (3 / 2) that the exporters (trainfit.export.fsdp)
  turn into FULL_SHARD / SHARD_GRAD_OP (reshard_after_forward on FSDP2). no-shard is DDP's memory
  and speed: trainfit runs DDP for it, so the key is refused with that fix. FSDP's CPU offload is
  training.offload optimizer+params with full-shard.
* training.offload with zero_stage 0 (outside FSDP): no tool has that mode (DeepSpeed's ZeRO-Offload
  needs stage >= 1), so it is refused with the three combinations people mean. (Offload with a ZeRO
  stage under distributed.strategy auto/ddp is still passed to no tool, as before: see the report.)
* training.activation_offload: TRL's SFTConfig / DPOConfig `activation_offloading` (the exporter
  writes it); plain TrainingArguments (method pretrain) has no such key, and CPU runs have nothing
  to offload to.
* training.optimizer_in_backward: the Hugging Face Trainer steps the optimizer after backward, so
  trainfit train cannot run it; estimate and plan model it. Its own conflicts (accumulation,
  clipping) are named as well so the message is complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainfit.core.memory.fsdp import FSDP_EQUIVALENT_STAGE

if TYPE_CHECKING:
    from trainfit.train.run_config import RunConfig


def sharding_knob_errors(cfg: RunConfig) -> list[str]:
    """One message per refused use of the keys above, naming the key and the fix."""
    t, errs = cfg.training, []
    strategy = cfg.distributed.strategy
    fsdp = t.fsdp_strategy
    if fsdp == "no-shard":
        errs.append("training.fsdp_strategy: no-shard replicates every state like DDP; trainfit train runs DDP "
                    "for that: remove fsdp_strategy (with distributed.strategy ddp or auto)")
    elif fsdp != "none":
        stage = FSDP_EQUIVALENT_STAGE[fsdp]
        if strategy != "fsdp":
            errs.append(f"training.fsdp_strategy: {fsdp} runs under distributed.strategy fsdp (got {strategy}); "
                        f"set distributed.strategy: fsdp")
        if t.zero_stage != stage:
            errs.append(f"training.zero_stage: fsdp_strategy {fsdp} shards like ZeRO-{stage}; set zero_stage: {stage} "
                        f"(got {t.zero_stage})")
        if t.offload == "optimizer":
            errs.append("training.offload: FSDP's CPU offload moves parameters, gradients and optimizer states "
                        "together; use offload: optimizer+params (or distributed.strategy deepspeed to offload the "
                        "optimizer alone)")
        elif t.offload == "optimizer+params" and fsdp != "full-shard":
            errs.append("training.offload: FSDP CPU offload runs with fsdp_strategy full-shard")
    if t.offload != "none" and t.zero_stage == 0 and strategy != "fsdp":
        errs.append(f"training.offload: {t.offload} with zero_stage 0 is not a mode of any tool (DeepSpeed "
                    f"ZeRO-Offload needs zero_stage >= 1): use distributed.strategy deepspeed with zero_stage 2 "
                    f"(3 for optimizer+params), or distributed.strategy fsdp with fsdp_strategy full-shard, "
                    f"zero_stage 3 and offload optimizer+params, or a paged optimizer (optimizer: paged-adamw-8bit "
                    f"/ paged-adamw-32bit) with offload: none")
    if t.activation_offload:
        if cfg.method == "pretrain":
            errs.append("training.activation_offload: method pretrain trains with TrainingArguments, which has no "
                        "activation offloading (TRL's SFTConfig/DPOConfig do); remove it, or use grad_checkpointing")
        if t.device == "cpu":
            errs.append("training.activation_offload: moves saved activations from a GPU to CPU memory; "
                        "device cpu has nothing to offload")
    if t.optimizer_in_backward:
        errs.append("training.optimizer_in_backward: trainfit train cannot run it (the Hugging Face Trainer steps "
                    "the optimizer after backward); `trainfit estimate --optimizer-in-backward` models it; remove it")
        if t.grad_accum > 1:
            errs.append(f"training.grad_accum: optimizer_in_backward frees each gradient at once, so it cannot "
                        f"accumulate {t.grad_accum} micro-batches; use grad_accum 1")
        if cfg.schedule.max_grad_norm > 0:
            errs.append("schedule.max_grad_norm: optimizer_in_backward steps each parameter before the others' "
                        "gradients exist, so there is no global norm to clip; set max_grad_norm: 0")
    return errs
