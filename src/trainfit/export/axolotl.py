"""A planned mode as an Axolotl config (`axolotl train axolotl.yaml`).

Keys are those of Axolotl's pydantic schema (axolotl.utils.schemas.config.AxolotlInputConfig,
validated by axolotl.utils.config.validate_config; checked against axolotl 0.19.0, the newest
release for Python 3.11, and the key names of main): base_model, adapter lora/qlora +
load_in_4bit, lora_r / lora_alpha / lora_dropout / lora_target_modules (or lora_target_linear),
sequence_len, micro_batch_size, gradient_accumulation_steps, bf16 / fp16, gradient_checkpointing,
attn_implementation, optimizer, learning_rate, lr_scheduler, warmup_steps, max_steps / num_epochs,
deepspeed or fsdp_config, datasets, rl: dpo, output_dir.
"""

from __future__ import annotations

from typing import Any

from trainfit.export.tools import (HF_OPTIM, ToolPlan, data_files, data_format, lora_targets, model_path,
                                   precision_flags, run_dir, steps_or_epochs, uses_fsdp)

ATTENTION = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}


def _datasets(plan: ToolPlan) -> list[dict[str, Any]]:
    cfg = plan.cfg
    fmt = data_format(cfg)
    rows = []
    for path in data_files(cfg):
        row: dict[str, Any] = {"path": path, "ds_type": "json" if path.endswith((".json", ".jsonl")) else "text"}
        if fmt == "preference":
            row["type"] = "chatml.prompt_pairs"  # prompt / chosen / rejected columns
        elif fmt == "chat":
            row.update(type="chat_template", field_messages=cfg.data.messages_column)
        else:
            row.update(type="completion", field=cfg.data.text_column)
        row["split"] = "train"
        rows.append(row)
    return rows


def _sharding(plan: ToolPlan) -> dict[str, Any]:
    t = plan.cfg.training
    if uses_fsdp(plan.cfg):
        strategy = {"shard-grad-op": "SHARD_GRAD_OP", "no-shard": "NO_SHARD"}.get(t.fsdp_strategy, "FULL_SHARD")
        return {"fsdp_version": 2, "fsdp_config": {
            "reshard_after_forward": strategy != "SHARD_GRAD_OP", "offload_params": t.offload == "optimizer+params",
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "FULL_STATE_DICT",
            "activation_checkpointing": t.grad_checkpointing != "none"}}
    if plan.deepspeed_file:
        return {"deepspeed": str(plan.folder / plan.deepspeed_file)}
    return {}


def files(plan: ToolPlan) -> tuple[dict[str, str], list[str]]:
    from trainfit.export.bundle import yaml_text

    cfg, t, s = plan.cfg, plan.cfg.training, plan.cfg.schedule
    bf16, fp16 = precision_flags(cfg)
    max_steps, epochs = steps_or_epochs(cfg)
    doc: dict[str, Any] = {"base_model": model_path(cfg)}
    if cfg.method in ("lora", "qlora") or (cfg.method == "dpo" and t.lora is not None):
        targets = lora_targets(cfg)
        doc["adapter"] = "qlora" if cfg.method == "qlora" else "lora"
        if cfg.method == "qlora" or t.quant in ("nf4", "nf4-dq"):
            doc["load_in_4bit"] = True
        elif t.quant == "int8":
            doc["load_in_8bit"] = True
        lo = t.lora
        assert lo is not None or cfg.method != "dpo"
        doc.update(lora_r=(lo.rank if lo else 16), lora_alpha=(lo.alpha if lo else 32),
                   lora_dropout=(lo.dropout if lo else 0.05))
        if targets == "all-linear":
            doc["lora_target_linear"] = True
        else:
            doc["lora_target_modules"] = list(targets)
        if t.dora:
            doc["peft_use_dora"] = True
        # Axolotl switches on its Triton LoRA kernels when these are unset; the plan's memory and time
        # are for PEFT's plain LoRA layers (and the kernels need a CUDA GPU).
        doc.update(lora_mlp_kernel=False, lora_qkv_kernel=False, lora_o_kernel=False)
    if cfg.method == "dpo":
        doc.update(rl="dpo", rl_beta=t.dpo_beta)
    doc["datasets"] = _datasets(plan)
    doc["dataset_prepared_path"] = str(plan.folder / "axolotl_prepared")
    doc["val_set_size"] = 0.0
    doc["output_dir"] = run_dir(plan, "axolotl")
    doc.update(sequence_len=t.seq_len, micro_batch_size=t.micro_batch, gradient_accumulation_steps=t.grad_accum,
               sample_packing=bool(cfg.data.packing), bf16=bf16, fp16=fp16, tf32=False,
               gradient_checkpointing=t.grad_checkpointing != "none", attn_implementation=ATTENTION[t.attention],
               optimizer=HF_OPTIM[t.optimizer], learning_rate=s.lr, lr_scheduler=s.scheduler,
               warmup_steps=s.warmup_steps, weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm)
    if max_steps:
        doc["max_steps"] = max_steps
    else:
        doc["num_epochs"] = float(epochs or 1.0)
    doc.update(save_steps=cfg.checkpointing.every_steps, save_total_limit=cfg.checkpointing.keep_last,
               logging_steps=cfg.logging.every_steps, seed=s.seed)
    if t.optimizer == "sgd-momentum":
        doc["optim_args"] = "momentum=0.9"  # Transformers' sgd has no momentum otherwise
    doc.update(_sharding(plan))
    differs = [
        "optimizer: Axolotl's examples use adamw_bnb_8bit / paged_adamw_8bit; the plan's optimizer is kept",
        "sample_packing: Axolotl's examples pack; packing follows the plan's data.packing",
        "lora_dropout: Axolotl's default 0.0; the plan's dropout is set",
        "val_set_size: set to 0 (Axolotl's default holds out none either; the plan has no eval split)",
    ]
    if "adapter" in doc:
        differs.insert(0, "lora_*_kernel: Axolotl turns its fused LoRA kernels on when unset (faster, less memory "
                          "than planned); off here, as planned")
    if cfg.training.precision in ("bf16-mixed", "fp16-mixed"):
        differs.append(f"precision {cfg.training.precision}: with bf16/fp16 true Axolotl also loads the weights in "
                       "16 bits (trainfit's mixed precision keeps fp32 master weights)")
    if cfg.training.precision == "fp32":
        differs.append("bf16 auto is Axolotl's usual choice on a GPU that has it; the plan runs fp32")
    return {"axolotl.yaml": yaml_text(doc)}, differs
