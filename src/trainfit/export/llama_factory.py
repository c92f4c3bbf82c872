"""A planned mode as a LLaMA-Factory config (`llamafactory-cli train llamafactory.yaml`).

Keys are fields of LLaMA-Factory's argument dataclasses (llamafactory.hparams: ModelArguments,
DataArguments, FinetuningArguments and its Seq2SeqTrainingArguments, parsed by
llamafactory.hparams.get_train_args through HfArgumentParser; checked against llamafactory
0.9.5). The data goes through a dataset_info.json written beside it (LLaMA-Factory reads datasets
by name from dataset_dir/dataset_info.json): chat rows as the sharegpt format with OpenAI-style
role/content tags, preference rows as a ranking dataset, plain text as the pt stage.
"""

from __future__ import annotations

import json
from typing import Any

from trainfit.export.bundle import yaml_text
from trainfit.export.tools import (HF_OPTIM, ToolPlan, data_files, data_format, lora_targets, model_path,
                                   precision_flags, run_dir, steps_or_epochs, uses_fsdp)

DATASET_NAME = "trainfit_plan_data"
DATASET_INFO = "dataset_info.json"
ATTENTION = {"sdpa": "sdpa", "flash": "fa2", "eager": "disabled"}
# LLaMA-Factory's chat templates by model family (llamafactory.data.template); "default" otherwise.
TEMPLATES = {"qwen2": "qwen", "qwen2.5": "qwen", "qwen3": "qwen3", "llama3": "llama3", "llama3.1": "llama3",
             "llama3.2": "llama3", "mistral": "mistral", "gemma": "gemma", "gemma2": "gemma", "phi3": "phi"}


def template(plan: ToolPlan) -> str:
    spec = plan.spec
    return TEMPLATES.get(spec.family) or spec.capabilities.llama_factory_template or "default"


def dataset_info(plan: ToolPlan) -> dict[str, Any]:
    """One dataset_info.json entry per data file (llamafactory.yaml's dataset names them all)."""
    cfg = plan.cfg
    fmt = data_format(cfg)
    entries = {}
    paths = data_files(cfg)
    for i, path in enumerate(paths):
        entry: dict[str, Any] = {"file_name": path}
        if fmt == "chat":
            entry.update(formatting="sharegpt", columns={"messages": cfg.data.messages_column},
                         tags={"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant", "system_tag": "system"})
        elif fmt == "preference":
            entry.update(ranking=True, columns={"prompt": cfg.data.prompt_column, "chosen": cfg.data.chosen_column,
                                                "rejected": cfg.data.rejected_column})
        else:
            entry["columns"] = {"prompt": cfg.data.text_column}
        entries[DATASET_NAME if len(paths) == 1 else f"{DATASET_NAME}_{i}"] = entry
    return entries


def _stage(plan: ToolPlan) -> str:
    if plan.cfg.method == "dpo":
        return "dpo"
    return "pt" if data_format(plan.cfg) == "text" else "sft"


def files(plan: ToolPlan) -> tuple[dict[str, str], list[str]]:
    cfg, t, s = plan.cfg, plan.cfg.training, plan.cfg.schedule
    bf16, fp16 = precision_flags(cfg)
    max_steps, epochs = steps_or_epochs(cfg)
    adapters = cfg.method in ("lora", "qlora") or (cfg.method == "dpo" and t.lora is not None)
    doc: dict[str, Any] = {"model_name_or_path": model_path(cfg), "stage": _stage(plan), "do_train": True,
                           "finetuning_type": "lora" if adapters else "full"}
    if adapters:
        lo = t.lora
        targets = lora_targets(cfg)
        doc.update(lora_rank=lo.rank if lo else 16, lora_alpha=lo.alpha if lo else 32,
                   lora_dropout=lo.dropout if lo else 0.05,
                   lora_target="all" if targets == "all-linear" else ",".join(targets))
        if t.dora:
            doc["use_dora"] = True
    if cfg.method == "qlora" or t.quant in ("nf4", "nf4-dq", "int8"):
        doc.update(quantization_method="bnb", quantization_bit=8 if t.quant == "int8" else 4)
        if t.quant != "int8":
            doc.update(quantization_type="nf4", double_quantization=t.quant == "nf4-dq")
    if cfg.method == "dpo":
        doc.update(pref_beta=t.dpo_beta, pref_loss="sigmoid")
    doc.update(dataset=",".join(dataset_info(plan)), dataset_dir=str(plan.folder), template=template(plan), cutoff_len=t.seq_len,
               packing=bool(cfg.data.packing), overwrite_cache=True, val_size=0.0)
    doc.update(output_dir=run_dir(plan, "llama-factory"), logging_steps=cfg.logging.every_steps,
               save_steps=cfg.checkpointing.every_steps, save_total_limit=cfg.checkpointing.keep_last,
               report_to="none", per_device_train_batch_size=t.micro_batch, gradient_accumulation_steps=t.grad_accum,
               learning_rate=s.lr, lr_scheduler_type=s.scheduler, warmup_steps=s.warmup_steps,
               weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm, optim=HF_OPTIM[t.optimizer], seed=s.seed)
    if max_steps:
        doc["max_steps"] = max_steps
    else:
        doc["num_train_epochs"] = float(epochs or 1.0)
    # bf16 (pure): LLaMA-Factory's pure_bf16 trains the bf16 weights without autocast, as the plan does.
    doc.update(bf16=bf16 and t.precision != "bf16", pure_bf16=t.precision == "bf16", fp16=fp16,
               disable_gradient_checkpointing=t.grad_checkpointing == "none", flash_attn=ATTENTION[t.attention])
    if t.optimizer == "sgd-momentum":
        doc["optim_args"] = "momentum=0.9"
    if t.device == "cpu":
        doc["use_cpu"] = True
    if plan.deepspeed_file and not uses_fsdp(cfg):
        doc["deepspeed"] = str(plan.folder / plan.deepspeed_file)
    differs = [
        "disable_gradient_checkpointing: LLaMA-Factory checkpoints activations unless told not to; the plan's "
        "choice is set",
        "lora_target: LLaMA-Factory's default is all (every linear layer); the plan's targets are set",
        "lora_rank / lora_alpha: LLaMA-Factory's defaults are 8 / 2 x rank; the plan's are set",
        "template: picked from the model family; check it matches your data's chat format",
    ]
    if t.num_gpus > 1 or doc.get("deepspeed"):
        differs.insert(0, "run: FORCE_TORCHRUN=1 llamafactory-cli train llamafactory.yaml (LLaMA-Factory starts "
                          "DeepSpeed and several GPUs only through torchrun)")
    if uses_fsdp(cfg):
        differs.append("FSDP: LLaMA-Factory shards with FSDP when started by `accelerate launch --config_file "
                       "accelerate.yaml` (beside this file): the sharding lives there, not in this file")
    if t.precision == "bf16-mixed":
        differs.append("bf16 true: LLaMA-Factory loads the weights in bf16 (trainfit's bf16-mixed keeps fp32 master "
                       "weights)")
    files = {"llamafactory.yaml": yaml_text(doc), DATASET_INFO: json.dumps(dataset_info(plan), indent=2) + "\n"}
    return files, differs
