"""A planned mode as a LitGPT fine-tune config (`litgpt finetune_lora --config litgpt.yaml`, or
finetune_full for full fine-tuning).

Keys are the arguments of litgpt.finetune.lora.setup / litgpt.finetune.full.setup as LitGPT's
jsonargparse CLI reads them (checked against litgpt 0.5.13): checkpoint_dir, out_dir, precision,
quantize, devices, num_nodes, lora_r / lora_alpha / lora_dropout, lora_query / lora_key /
lora_value / lora_projection / lora_mlp / lora_head, data (litgpt.data.JSON), train (TrainArgs:
global_batch_size, micro_batch_size, max_seq_length, max_steps / epochs, lr_warmup_steps,
save_interval, max_norm), eval (EvalArgs), optimizer (class_path + init_args), seed.

LitGPT's JSON data module reads instruction / input / output rows: the plan's chat or text rows
are converted into litgpt_data.json beside this file (one row per conversation: the turns before
the last assistant reply are the instruction, that reply the output).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfit.errors import BadInputError
from trainfit.export.bundle import yaml_text
from trainfit.export.tools import ToolPlan, data_files, data_format, lora_targets, model_path, run_dir

DATA_FILE = "litgpt_data.json"
PRECISION = {"fp32": "32-true", "bf16": "bf16-true", "bf16-mixed": "bf16-mixed", "fp16": "16-true",
             "fp16-mixed": "16-mixed"}
QUANTIZE = {"nf4": "bnb.nf4", "nf4-dq": "bnb.nf4-dq", "int8": "bnb.int8-training"}
OPTIMIZERS = {"adamw": "torch.optim.AdamW", "sgd": "torch.optim.SGD", "sgd-momentum": "torch.optim.SGD",
              "adafactor": "torch.optim.Adafactor", "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
              "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
              "paged-adamw-32bit": "bitsandbytes.optim.PagedAdamW32bit", "lion": "bitsandbytes.optim.Lion"}
# PEFT module names -> LitGPT's switches (litgpt.lora.Config: one fused qkv, proj, the MLP, the head).
LORA_SWITCHES = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value", "o_proj": "lora_projection",
                 "gate_proj": "lora_mlp", "up_proj": "lora_mlp", "down_proj": "lora_mlp", "lm_head": "lora_head"}
MAX_CONVERTED_BYTES = 256 << 20  # larger data: convert it to instruction/output rows yourself


def lora_switches(plan: ToolPlan) -> dict[str, bool]:
    targets = lora_targets(plan.cfg)
    switches = dict.fromkeys(sorted(set(LORA_SWITCHES.values())), False)
    if targets == "all-linear":
        return {**switches, **dict.fromkeys(("lora_query", "lora_key", "lora_value", "lora_projection",
                                             "lora_mlp"), True)}
    unknown = sorted(set(targets) - set(LORA_SWITCHES))
    if unknown:
        raise BadInputError(f"--for litgpt: LoRA target(s) {', '.join(unknown)} have no LitGPT switch (valid: "
                            f"{', '.join(LORA_SWITCHES)})")
    for name in targets:
        switches[LORA_SWITCHES[name]] = True
    return switches


def _row(record: dict[str, Any], fmt: str, plan: ToolPlan) -> dict[str, str] | None:
    d = plan.cfg.data
    if fmt == "text":
        text = record.get(d.text_column)
        return {"instruction": "", "input": "", "output": str(text)} if text else None
    turns = record.get(d.messages_column) or []
    last = max((i for i, m in enumerate(turns) if isinstance(m, dict) and m.get("role") == "assistant"), default=None)
    if last is None:
        return None
    before = [m for m in turns[:last] if isinstance(m, dict)]
    instruction = before[-1].get("content", "") if len(before) == 1 else "\n".join(
        f"{m.get('role')}: {m.get('content', '')}" for m in before)
    return {"instruction": str(instruction), "input": "", "output": str(turns[last].get("content", ""))}


def converted_data(plan: ToolPlan) -> str:
    """The plan's JSON/JSONL rows as LitGPT's instruction/input/output JSON list."""
    from trainfit.validate import read_text_file

    fmt, rows = data_format(plan.cfg), []
    for path in data_files(plan.cfg):
        p = Path(path)
        if p.suffix not in (".json", ".jsonl") or not p.is_file():
            raise BadInputError(f"--for litgpt: {path} is not a .json/.jsonl file; LitGPT's JSON data module needs "
                                "instruction/input/output rows (convert the data, then plan with --data FILE)")
        if p.stat().st_size > MAX_CONVERTED_BYTES:
            raise BadInputError(f"--for litgpt: {path} is over {MAX_CONVERTED_BYTES >> 20} MiB; convert it to "
                                "instruction/input/output rows yourself and plan with --data FILE")
        text = read_text_file(path, "--data", max_bytes=MAX_CONVERTED_BYTES)
        records = json.loads(text) if p.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
        rows += [r for r in (_row(rec, fmt, plan) for rec in records if isinstance(rec, dict)) if r]
    if len(rows) < 2:
        raise BadInputError("--for litgpt: the data has fewer than two usable rows (LitGPT holds one out to validate)")
    return json.dumps(rows, indent=1) + "\n"


def checkpoint_dir(plan: ToolPlan) -> str:
    cfg = plan.cfg
    return model_path(cfg) if cfg.model.path else f"checkpoints/{cfg.model.id}"  # where `litgpt download` writes


def files(plan: ToolPlan) -> tuple[dict[str, str], list[str]]:
    cfg, t, s = plan.cfg, plan.cfg.training, plan.cfg.schedule
    devices = max(1, t.num_gpus // max(1, t.num_nodes)) if t.device != "cpu" else 1
    doc: dict[str, Any] = {"checkpoint_dir": checkpoint_dir(plan), "out_dir": run_dir(plan, "litgpt"),
                           "precision": PRECISION[t.precision]}
    adapters = cfg.method in ("lora", "qlora")
    quant = t.quant if t.quant != "none" else ("nf4" if cfg.method == "qlora" else "none")
    if quant in QUANTIZE:
        doc["quantize"] = QUANTIZE[quant]
    doc.update(devices=devices, num_nodes=max(1, t.num_nodes))
    if adapters:
        lo = t.lora
        doc.update(lora_r=lo.rank if lo else 16, lora_alpha=lo.alpha if lo else 32,
                   lora_dropout=lo.dropout if lo else 0.05, **lora_switches(plan))
    doc["data"] = {"class_path": "litgpt.data.JSON", "init_args": {
        "json_path": str(plan.folder / DATA_FILE), "mask_prompt": False, "val_split_fraction": 0.05,
        "prompt_style": "alpaca", "ignore_index": -100, "seed": s.seed, "num_workers": cfg.data.num_workers}}
    world = devices * max(1, t.num_nodes)
    train: dict[str, Any] = {"save_interval": cfg.checkpointing.every_steps, "log_interval": cfg.logging.every_steps,
                             "global_batch_size": t.micro_batch * t.grad_accum * world,
                             "micro_batch_size": t.micro_batch, "lr_warmup_steps": s.warmup_steps,
                             "max_seq_length": t.seq_len, "min_lr": 0.0}
    if s.max_steps:
        train.update(max_steps=s.max_steps, epochs=1_000_000)  # LitGPT stops at whichever comes first
    else:
        train["epochs"] = max(1, round(s.epochs or 1.0))
    doc["train"] = train
    doc["eval"] = {"interval": 1_000_000, "max_new_tokens": 100, "max_iters": 1, "initial_validation": False,
                   "final_validation": False}
    opt: dict[str, Any] = {"lr": s.lr, "weight_decay": s.weight_decay}
    if t.optimizer == "sgd-momentum":
        opt["momentum"] = 0.9
    doc["optimizer"] = {"class_path": OPTIMIZERS[t.optimizer], "init_args": opt}
    doc.update(logger_name="csv", seed=s.seed)
    command = "finetune_lora" if adapters else "finetune_full"
    differs = [f"run: litgpt {command} --config litgpt.yaml",
               "eval: LitGPT validates every 100-600 steps and at the end; the plan has no eval, so it is switched off",
               "lora_query / lora_value only are LitGPT's LoRA defaults (r 8, alpha 16); the plan's targets are set"]
    if s.max_grad_norm:
        differs.append(f"gradient clipping: LitGPT's fine-tune scripts do not clip (train.max_norm is refused); the "
                       f"plan clips at {s.max_grad_norm}")
    if t.grad_checkpointing != "none":
        differs.append("activation checkpointing: LitGPT's fine-tune scripts have no switch for it; the plan's "
                       "memory figure assumes it, so this run uses more activation memory than planned")
    if world > 1:
        differs.append("sharding: LitGPT shards with FSDP (FSDPStrategy) on several devices, whatever ZeRO stage "
                       "the plan chose")
    if not cfg.model.path:
        differs.append(f"checkpoint: `litgpt download {cfg.model.id}` first (it writes {checkpoint_dir(plan)})")
    else:
        differs.append("checkpoint: a Hugging Face folder needs `litgpt convert_to_litgpt` first (lit_model.pth)")
    return {"litgpt.yaml": yaml_text(doc), DATA_FILE: converted_data(plan)}, differs
