"""Refusals for the sharding / offload knobs: combinations no real tool runs, each with the one to use.

Decisions:
* Offload without ZeRO (`--offload optimizer`, ZeRO stage 0): DeepSpeed's ZeRO-Offload needs stage
  >= 1 (offload_optimizer is a zero_optimization key), so this is no mode of any tool. What people
  mean is one of three things, and the message names all three: DeepSpeed `--zero 2 --offload
  optimizer` (runs on one GPU too), FSDP `--fsdp full-shard --offload optimizer+params`, or a paged
  optimizer (`--optimizer paged-adamw-8bit | paged-adamw-32bit`: states in unified memory that the
  driver pages to CPU RAM under pressure, no sharding engine).
* FSDP's CPUOffload has one switch, offload_params, which moves parameters, gradients and the
  optimizer step together: `--offload optimizer` alone is refused under FSDP; it is allowed with
  FULL_SHARD (what practitioners pair it with; SHARD_GRAD_OP keeps the gathered parameters on the
  GPU anyway).
* Optimizer in backward (torchtune optimizer_in_bwd): steps each parameter as its gradient
  appears, so there is no accumulated gradient to keep (grad_accum must be 1) and no global norm
  to clip; modelled on one GPU without a sharding engine, as torchtune's single-device recipe runs it.
"""

from __future__ import annotations

from trainfit.core.memory.framework_effects import framework_problems
from trainfit.core.memory.fsdp import FSDP_EQUIVALENT_STAGE, SHARDED_STRATEGIES
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError

GPU_DEVICES = ("cuda", "rocm", "xpu")

OFFLOAD_WITHOUT_ZERO = (
    "--offload {offload} with --zero 0 is not a mode of any tool (DeepSpeed ZeRO-Offload needs stage >= 1). "
    "Use --zero 2 --offload optimizer (DeepSpeed ZeRO-Offload, one GPU or more), --fsdp full-shard --offload "
    "optimizer+params (FSDP CPU offload), or --optimizer paged-adamw-8bit / paged-adamw-32bit (optimizer "
    "states paged to CPU RAM under memory pressure, no sharding engine) with --offload none")


def knob_problems(setup: TrainingSetup) -> list[str]:
    """Every refused combination of the sharding / offload knobs, one message each."""
    problems: list[str] = []
    fsdp = setup.fsdp_strategy
    if fsdp != "none":
        problems += _fsdp_problems(setup)
    elif setup.offload != "none" and setup.zero_stage == 0:
        problems.append(OFFLOAD_WITHOUT_ZERO.format(offload=setup.offload))
    if setup.activation_offload:
        if setup.method == "inference":
            problems.append("--activation-offload moves activations saved for backward: inference saves none")
        elif setup.device not in GPU_DEVICES:
            problems.append(f"--activation-offload moves saved activations from a GPU to pinned CPU memory; "
                            f"device {setup.device!r} has no separate memory to offload from")
    if setup.optimizer_in_backward:
        problems += _in_backward_problems(setup)
    return problems + framework_problems(setup)


def _fsdp_problems(setup: TrainingSetup) -> list[str]:
    fsdp, out = setup.fsdp_strategy, []
    stage = FSDP_EQUIVALENT_STAGE[fsdp]
    if setup.zero_stage != stage:
        out.append(f"--fsdp {fsdp} shards like ZeRO-{stage}, not --zero {setup.zero_stage}: FSDP replaces "
                   f"DeepSpeed, drop --zero")
    if setup.device not in GPU_DEVICES:
        out.append(f"--fsdp needs GPUs (NCCL/RCCL); device {setup.device!r} does not support it")
    if setup.method == "inference":
        out.append("--fsdp applies to training; inference has no optimizer or gradients to shard")
    if setup.offload == "optimizer":
        out.append("--fsdp: FSDP's CPU offload moves parameters, gradients and optimizer states together: "
                   "use --offload optimizer+params (or DeepSpeed --zero 2 --offload optimizer to offload "
                   "the optimizer alone)")
    elif setup.offload == "optimizer+params" and fsdp != "full-shard":
        out.append(f"--offload optimizer+params with --fsdp {fsdp}: FSDP CPU offload is run with "
                   f"--fsdp full-shard (the sharded parameters are what moves to the CPU)")
    if fsdp in SHARDED_STRATEGIES and setup.num_gpus == 1 and setup.offload == "none":
        out.append(f"--fsdp {fsdp} on one GPU shards nothing: use --gpus >= 2, or --fsdp full-shard "
                   f"--offload optimizer+params")
    if setup.hybrid_shard and fsdp != "full-shard":
        out.append("hybrid sharding (HYBRID_SHARD) is full-shard inside each node: use --fsdp full-shard")
    return out


def _in_backward_problems(setup: TrainingSetup) -> list[str]:
    out = []
    if setup.method == "inference":
        out.append("--optimizer-in-backward applies to training, not inference")
    if setup.grad_accum > 1:
        out.append(f"--optimizer-in-backward steps each parameter as soon as its gradient exists, so gradients "
                   f"cannot accumulate over micro-batches: use --grad-accum 1 (got {setup.grad_accum}), or drop "
                   f"--optimizer-in-backward")
    if setup.zero_stage or setup.fsdp_strategy != "none" or setup.offload != "none" or setup.num_gpus > 1:
        out.append("--optimizer-in-backward is modelled on one GPU without a sharding engine (torchtune's "
                   "single-device recipe): drop --zero/--fsdp/--offload and use --gpus 1")
    return out


def check_knobs(setup: TrainingSetup) -> None:
    """BadInputError listing every refused knob combination; nothing when the setup is valid."""
    problems = knob_problems(setup)
    if problems:
        raise BadInputError("; ".join(problems))
