"""TrainingArguments / TRL config keyword arguments for a run config.

`trainfit train` builds its Trainer arguments from `trainer_config`, and training_args.yaml is
the same dict, so what is exported is what runs. Methods: pretrain uses Transformers' Trainer
(TrainingArguments); dpo uses TRL's DPOTrainer (DPOConfig); every other method (full fine-tuning,
lora, qlora) uses TRL's SFTTrainer (SFTConfig).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainfit.export.deepspeed import deepspeed_config
from trainfit.export.engine import sharding_engine
from trainfit.export.fsdp import fsdp_arguments

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

# trainfit optimizer -> TrainingArguments `optim`. sgd-momentum adds optim_args momentum=0.9.
OPTIM_NAMES = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit",
               "paged-adamw-32bit": "paged_adamw_32bit",
               "sgd": "sgd", "sgd-momentum": "sgd", "adafactor": "adafactor", "lion": "lion_32bit"}
# Optimizers whose kernels come from bitsandbytes (CUDA only).
NEEDS_BITSANDBYTES = frozenset({"adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit", "lion"})
# Config class name -> the module that defines it.
CONFIG_MODULES = {"TrainingArguments": "transformers", "SFTConfig": "trl", "DPOConfig": "trl"}


def optim_name(t, *, device: str, deepspeed: bool) -> str:
    """TrainingArguments `optim` for the run's optimizer. AdamW on a GPU is torch's fused kernel
    (Transformers' own default since torch 2.8): the foreach kernel that "adamw_torch" selects on CUDA
    allocates a temporary the size of the optimizer's second moment (4 bytes per trainable
    parameter) at every step, which the memory model does not charge. DeepSpeed and CPU offload
    bring their own optimizer path, and on CPU the loop kernel is what the CPU models were checked on."""
    if t.optimizer == "adamw" and device == "cuda" and not deepspeed and t.offload == "none":
        return "adamw_torch_fused"
    return OPTIM_NAMES[t.optimizer]


def training_arguments(cfg: RunConfig, *, device: str, output_dir: str, world_size: int, transformers_major: int,
                       deepspeed_file: str | None = None) -> dict[str, Any]:
    """TrainingArguments kwargs (the keys every Trainer config class shares).

    device: the resolved device (cpu, cuda, mps); world_size: the number of processes.
    deepspeed_file: reference this JSON file instead of embedding the DeepSpeed dict.
    """
    t, s = cfg.training, cfg.schedule
    # Transformers 5 renamed gradient_checkpointing (kept as a deprecated alias until v6).
    checkpointing_key = "activation_checkpointing" if transformers_major >= 5 else "gradient_checkpointing"
    kw: dict[str, Any] = dict(
        output_dir=output_dir, per_device_train_batch_size=t.micro_batch,
        gradient_accumulation_steps=t.grad_accum, learning_rate=s.lr, lr_scheduler_type=s.scheduler,
        warmup_steps=s.warmup_steps, weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm,
        seed=s.seed, data_seed=s.seed, optim=optim_name(t, device=device, deepspeed=deepspeed_file is not None),
        save_strategy="steps", save_steps=cfg.checkpointing.every_steps,
        logging_strategy="steps", logging_steps=cfg.logging.every_steps,
        report_to="none", disable_tqdm=True, use_cpu=device == "cpu",
        dataloader_num_workers=dataloader_workers(cfg),
        bf16=t.precision == "bf16-mixed", fp16=t.precision == "fp16-mixed",
    )
    kw[checkpointing_key] = t.grad_checkpointing != "none"  # "selective" runs as full: no selective mode
    if cfg.data.prefetch_factor is not None and kw["dataloader_num_workers"] > 0:
        kw["dataloader_prefetch_factor"] = cfg.data.prefetch_factor
    if t.optimizer == "sgd-momentum":
        kw["optim_args"] = "momentum=0.9"
    if s.max_steps is not None:
        kw["max_steps"] = s.max_steps
    else:
        kw["num_train_epochs"] = s.epochs
    if world_size > 1:
        backend = cfg.distributed.backend
        kw["ddp_backend"] = ("nccl" if device == "cuda" else "gloo") if backend == "auto" else backend
        kw["ddp_find_unused_parameters"] = False
    sharded = sharding_engine(cfg)
    if sharded == "fsdp":
        kw.update(fsdp_arguments(t.zero_stage, t.offload != "none", transformers_major=transformers_major,
                                 hybrid_replicas=t.num_nodes if t.hybrid_shard else 1))
        if t.grad_accum > 1:
            # Reduce-scatter after every micro-batch: under the Trainer's default no_sync each GPU
            # would keep every unit's unsharded gradient until the last one (a whole model's
            # gradient per GPU; trainfit.core.runtime, fsdp_no_sync).
            kw["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    elif sharded == "deepspeed":
        kw["deepspeed"] = deepspeed_file if deepspeed_file is not None else deepspeed_config(cfg)
    return kw


def dataloader_workers(cfg: RunConfig) -> int:
    """DataLoader worker processes: data.num_workers, and at most one for a stream. datasets deals a
    stream's shards out to the workers and the DataLoader takes their batches in turn, so the order
    would depend on the worker count; one worker still reads ahead while the model trains."""
    d = cfg.data
    return min(d.num_workers, 1) if d.streaming else d.num_workers


def config_class_name(cfg: RunConfig) -> str:
    """TrainingArguments (pretrain), DPOConfig (dpo) or SFTConfig (every other method)."""
    if cfg.method == "pretrain":
        return "TrainingArguments"
    return "DPOConfig" if cfg.method == "dpo" else "SFTConfig"


def trl_arguments(cfg: RunConfig) -> dict[str, Any]:
    """The TRL-only keys of SFTConfig / DPOConfig (none for pretraining)."""
    t = cfg.training
    if cfg.method == "pretrain":
        return {}  # training.activation_offload is refused for pretrain (trainfit.core.knob_rules)
    # TRL's saved-tensor hooks move activations to pinned CPU memory (SFTConfig / DPOConfig key);
    # written only when set, so configs without it export what they always did.
    offload = {"activation_offloading": True} if t.activation_offload else {}
    if cfg.method == "dpo":
        return {"max_length": t.seq_len, "beta": t.dpo_beta,
                "precompute_ref_log_probs": t.dpo_reference == "precomputed", **offload}
    # Rows arrive as "text" or chat "messages" (trainfit.train.data.rename_for_trl). Without packing
    # every row is one sequence of at most seq_len tokens; with data.packing TRL packs whole rows
    # into seq_len rows (its default best-fit strategy, padding-free).
    return {"max_length": t.seq_len, "packing": bool(cfg.data.packing), "dataset_text_field": "text", **offload}


def trainer_config(cfg: RunConfig, *, device: str, output_dir: str, world_size: int, transformers_major: int,
                   deepspeed_file: str | None = None) -> tuple[str, dict[str, Any]]:
    """(config class name, its full kwargs): training_arguments plus the TRL keys."""
    kw = training_arguments(cfg, device=device, output_dir=output_dir, world_size=world_size,
                            transformers_major=transformers_major, deepspeed_file=deepspeed_file)
    return config_class_name(cfg), {**kw, **trl_arguments(cfg)}
