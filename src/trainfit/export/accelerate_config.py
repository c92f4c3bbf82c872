"""The Accelerate config file (accelerate.yaml) that `accelerate launch --config_file` loads.

Schema: accelerate.commands.config.config_args.ClusterConfig (compute_environment LOCAL_MACHINE).
distributed_type follows trainfit.export.engine: FSDP and DEEPSPEED for the sharding engines,
MULTI_GPU / MULTI_CPU for DDP with several processes, NO for one process.

* mixed_precision mirrors TrainingArguments' bf16/fp16 (bf16-mixed -> bf16, fp16-mixed -> fp16,
  everything else -> no: pure bf16/fp16 casts the weights, it does not autocast). It is left out
  for DeepSpeed: with `deepspeed_config_file` Accelerate refuses a mixed_precision from the config
  file (DeepSpeedPlugin._deepspeed_config_checks); deepspeed.json carries it ("auto" from the
  arguments) instead.
* FSDP: the fsdp_config block carries the settings that trainfit.export.fsdp gives the Trainer.
* DeepSpeed: the deepspeed_config block only names the JSON file (relative to the folder the
  launch runs in); every other DeepSpeed setting lives in that file, as Accelerate requires.
* MULTI_CPU: `accelerate launch` starts several CPU processes only through mpirun (mpirun_config);
  trainfit's launch.sh uses torchrun on CPU, so this file documents the setup there.
* Several nodes (num_machines > 1): num_processes counts every node's processes (Accelerate's
  meaning); machine_rank is 0 and main_process_ip empty in the file because one file serves every
  node: launch.sh passes --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR
  --main_process_port $MASTER_PORT, which Accelerate prefers to the file's values
  (trainfit.export.launch). rdzv_backend static, as the torchrun command uses: machine_rank 0 is
  then the process that writes the run directory (trainfit.export.launch says why not c10d).
* Hybrid sharding (training.hybrid_shard on several nodes, FSDP): FSDP2 (Transformers 5) takes it
  as Accelerate's parallelism_config, dp_replicate_size = nodes x dp_shard_size = GPUs per node
  (HSDP); FSDP1 as the HYBRID_SHARD sharding strategy (trainfit.export.fsdp).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainfit.errors import BadInputError
from trainfit.export.engine import engine
from trainfit.export.fsdp import accelerate_fsdp_block

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

DEVICES = ("cpu", "cuda", "mps")


def mixed_precision(cfg: RunConfig) -> str:
    """Accelerate's mixed_precision value for training.precision."""
    return {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(cfg.training.precision, "no")


def distributed_type(cfg: RunConfig, *, num_processes: int, device: str) -> str:
    """Accelerate's DistributedType name for this config on device with num_processes processes."""
    eng = engine(cfg, num_processes=num_processes)
    if eng == "fsdp":
        return "FSDP"
    if eng == "deepspeed":
        return "DEEPSPEED"
    if eng == "single":
        return "NO"
    if device == "cuda":
        return "MULTI_GPU"
    if device == "cpu":
        return "MULTI_CPU"
    raise BadInputError(f"{num_processes} processes on {device}: several processes need device cuda or cpu "
                        f"(torch.distributed has no {device} backend)", hint="use one process on this device")


def accelerate_config(cfg: RunConfig, *, num_processes: int, device: str, transformers_major: int,
                      deepspeed_file: str = "deepspeed.json", num_machines: int = 1) -> dict[str, Any]:
    """The Accelerate config dict (YAML-ready) for num_machines machines running num_processes
    processes together (one machine by default)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} (a resolved device), got {device!r}")
    dist = distributed_type(cfg, num_processes=num_processes, device=device)
    conf: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": dist,
        "num_processes": num_processes,
        "num_machines": num_machines,
        "machine_rank": 0,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": device == "cpu",
        "debug": False,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
    }
    if num_machines > 1:
        from trainfit.export.launch import DEFAULT_MASTER_PORT

        conf["main_process_ip"] = None  # given per node by launch.sh (--main_process_ip "$MASTER_ADDR")
        conf["main_process_port"] = DEFAULT_MASTER_PORT
    if dist != "DEEPSPEED":
        conf["mixed_precision"] = mixed_precision(cfg)
    if device == "cuda":
        conf["gpu_ids"] = "all"
    t = cfg.training
    if dist == "FSDP":
        hybrid = num_machines if t.hybrid_shard and num_machines > 1 and t.zero_stage >= 3 else 1
        conf["fsdp_config"] = accelerate_fsdp_block(t.zero_stage, t.offload != "none",
                                                    transformers_major=transformers_major, hybrid_replicas=hybrid)
        if hybrid > 1 and transformers_major >= 5:
            conf["parallelism_config"] = {"parallelism_config_dp_replicate_size": hybrid,
                                          "parallelism_config_dp_shard_size": num_processes // hybrid}
    elif dist == "DEEPSPEED":
        conf["deepspeed_config"] = {"deepspeed_config_file": deepspeed_file}
    return conf
