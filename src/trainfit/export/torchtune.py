"""A planned mode as a torchtune recipe config (`tune run <recipe> --config torchtune.yaml`).

Keys follow torchtune's recipe configs (recipes/configs/llama3_2/1B_lora_single_device.yaml and
the full / distributed / QLoRA ones; checked against torchtune 0.6.1): model (a `_component_`
builder with lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
lora_dropout, quantize_base for QLoRA), tokenizer, checkpointer, dataset, batch_size,
gradient_accumulation_steps, optimizer, lr_scheduler, loss, epochs, max_steps_per_epoch, device,
dtype, enable_activation_checkpointing, enable_activation_offloading, fsdp_cpu_offload.

The model is built with torchtune's component builder for its architecture (llama3_2 for Llama,
qwen2 for Qwen2/2.5) from the plan's exact shapes, so any size of those families works, including
a local checkpoint; other architectures are refused (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfit.core.models.capabilities import TORCHTUNE_ARCHITECTURES
from trainfit.errors import BadInputError
from trainfit.export.bundle import yaml_text
from trainfit.export.tools import ToolPlan, data_files, data_format, lora_targets, model_path, run_dir

# HF module name -> torchtune's LORA_ATTN_MODULES key (torchtune.modules.peft).
ATTN_KEYS = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
MLP_NAMES = {"gate_proj", "up_proj", "down_proj"}
# The builder (torchtune.models.<builder>) is ModelCapabilities.torchtune_builder; the checkpointer's
# model_type is its upper case. Llama 3.2's builder carries Llama 3's RoPE scaling and defaults;
# Qwen2's takes Qwen2's BPE tokenizer files.
LLAMA3_BUILDER, QWEN2_BUILDER = "llama3_2", "qwen2"
DTYPES = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16", "fp16": "fp16", "fp16-mixed": "fp16"}
OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
              "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
              "paged-adamw-32bit": "bitsandbytes.optim.PagedAdamW32bit", "sgd": "torch.optim.SGD",
              "sgd-momentum": "torch.optim.SGD", "adafactor": "torch.optim.Adafactor",
              "lion": "bitsandbytes.optim.Lion"}


def recipe(plan: ToolPlan) -> str:
    """The recipe `tune run` starts: LoRA/QLoRA or full, one device or distributed."""
    cfg = plan.cfg
    kind = "lora" if cfg.method in ("lora", "qlora") else "full"
    where = "distributed" if cfg.training.num_gpus > 1 else "single_device"
    return f"{kind}_finetune_{where}"


def lora_keys(plan: ToolPlan) -> dict[str, Any]:
    """PEFT target names -> torchtune's lora_attn_modules / apply_lora_to_mlp / apply_lora_to_output."""
    targets = lora_targets(plan.cfg)
    if targets == "all-linear":
        return {"lora_attn_modules": list(ATTN_KEYS.values()), "apply_lora_to_mlp": True,
                "apply_lora_to_output": False}
    names = set(targets)
    unknown = names - set(ATTN_KEYS) - MLP_NAMES - {"lm_head"}
    if unknown:
        raise BadInputError(f"--for torchtune: LoRA target(s) {', '.join(sorted(unknown))} have no torchtune key "
                            "(valid: q_proj, k_proj, v_proj, o_proj, the MLP's gate/up/down_proj, lm_head)")
    if names & MLP_NAMES and not MLP_NAMES <= names:
        raise BadInputError("--for torchtune: torchtune adapts the whole MLP or none of it (apply_lora_to_mlp); "
                            f"the plan targets only {', '.join(sorted(names & MLP_NAMES))}")
    return {"lora_attn_modules": [ATTN_KEYS[n] for n in ATTN_KEYS if n in names],
            "apply_lora_to_mlp": bool(names & MLP_NAMES), "apply_lora_to_output": "lm_head" in names}


def _local_config(cfg) -> dict[str, Any]:
    if not cfg.model.path:
        return {}
    try:
        return json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def model_section(plan: ToolPlan) -> dict[str, Any]:
    cfg, spec = plan.cfg, plan.spec
    builder = spec.capabilities.torchtune_builder
    if not builder:
        raise BadInputError(f"--for torchtune: architecture {spec.architecture!r} has no torchtune builder here "
                            f"(written for: {', '.join(TORCHTUNE_ARCHITECTURES)})",
                            hint="plan --for trl, axolotl or llama-factory")
    local = _local_config(cfg)
    scaling = local.get("rope_scaling") or {}
    llama = builder == LLAMA3_BUILDER
    if llama and spec.family not in ("llama3.1", "llama3.2") and scaling.get("rope_type") != "llama3":
        # torchtune's llama3_2 builder always applies Llama 3's RoPE scaling: right for Llama 3.1 / 3.2 only
        raise BadInputError(f"--for torchtune: {spec.id} is a Llama without Llama 3.1's RoPE scaling; this export "
                            "covers Llama 3.1 / 3.2 and Qwen2 / 2.5", hint="plan --for trl, axolotl or llama-factory")
    adapters = cfg.method in ("lora", "qlora")
    name = ("lora_" if adapters else "") + builder
    model: dict[str, Any] = {"_component_": f"torchtune.models.{builder}.{name}"}
    if adapters:
        lo = cfg.training.lora
        model.update(lora_keys(plan))
        model.update(lora_rank=lo.rank if lo else 16, lora_alpha=float(lo.alpha if lo else 32),
                     lora_dropout=lo.dropout if lo else 0.05, use_dora=bool(cfg.training.dora),
                     quantize_base=cfg.method == "qlora")
    model.update(vocab_size=spec.vocab_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
                 num_kv_heads=spec.num_kv_heads, embed_dim=spec.hidden_size, intermediate_dim=spec.intermediate_size,
                 max_seq_len=spec.max_position_embeddings,
                 norm_eps=float(local.get("rms_norm_eps", 1e-5 if llama else 1e-6)),
                 rope_base=float(local.get("rope_theta", 500_000.0 if llama else 1_000_000.0)),
                 tie_word_embeddings=bool(spec.tie_embeddings))
    if llama:
        model["scale_factor"] = int(scaling.get("factor", 32 if spec.family != "llama3.1" else 8))
    return model


def _checkpoint_files(cfg) -> list[str] | dict[str, str]:
    """The safetensors files of a local checkpoint; for a Hub id the shard names `tune download` fetches
    follow model-0000N-of-0000M.safetensors (or model.safetensors): the header says to check them."""
    if cfg.model.path:
        found = sorted(p.name for p in Path(cfg.model.path).glob("*.safetensors"))
        if found:
            return found
    return ["model.safetensors"]


def tokenizer_section(plan: ToolPlan, ckpt: str) -> dict[str, Any]:
    t = plan.cfg.training
    if plan.spec.capabilities.torchtune_builder == QWEN2_BUILDER:
        # Qwen2.5's tokenizer also needs its tool-call tokens; a Qwen2-architecture checkpoint of
        # another family (or a local one) gets Qwen2's, which needs only <|im_start|> / <|im_end|>.
        name = "qwen2_5.qwen2_5_tokenizer" if plan.spec.family == "qwen2.5" else "qwen2.qwen2_tokenizer"
        return {"_component_": f"torchtune.models.{name}", "path": f"{ckpt}/vocab.json",
                "merges_file": f"{ckpt}/merges.txt", "special_tokens_path": f"{ckpt}/tokenizer.json",
                "max_seq_len": t.seq_len}
    return {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": f"{ckpt}/original/tokenizer.model",
            "special_tokens_path": f"{ckpt}/tokenizer.json", "max_seq_len": t.seq_len}


def dataset_section(plan: ToolPlan) -> dict[str, Any]:
    cfg = plan.cfg
    paths = data_files(cfg)
    source = "json" if paths[0].endswith((".json", ".jsonl")) else "text"
    if data_format(cfg) == "chat":
        return {"_component_": "torchtune.datasets.chat_dataset", "source": source, "data_files": paths,
                "conversation_column": cfg.data.messages_column, "conversation_style": "openai",
                "split": "train", "packed": bool(cfg.data.packing)}
    return {"_component_": "torchtune.datasets.text_completion_dataset", "source": source, "data_files": paths,
            "column": cfg.data.text_column, "split": "train", "packed": bool(cfg.data.packing)}


def files(plan: ToolPlan) -> tuple[dict[str, str], list[str]]:
    cfg, t, s = plan.cfg, plan.cfg.training, plan.cfg.schedule
    ckpt = model_path(cfg)
    hub = not cfg.model.path
    if hub:
        ckpt = f"/tmp/{ckpt.rsplit('/', 1)[-1]}"  # where `tune download ID --output-dir` puts it in the docs
    out = run_dir(plan, "torchtune")
    doc: dict[str, Any] = {"output_dir": out, "model": model_section(plan), "tokenizer": tokenizer_section(plan, ckpt)}
    doc["checkpointer"] = {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": ckpt,
                           "checkpoint_files": _checkpoint_files(cfg), "recipe_checkpoint": None,
                           "output_dir": out, "model_type": plan.spec.capabilities.torchtune_builder.upper()}
    doc["resume_from_checkpoint"] = False
    if cfg.method in ("lora", "qlora"):
        doc["save_adapter_weights_only"] = True
    doc["dataset"] = dataset_section(plan)
    doc.update(seed=s.seed, shuffle=True, batch_size=t.micro_batch, gradient_accumulation_steps=t.grad_accum)
    opt: dict[str, Any] = {"_component_": OPTIMIZERS[t.optimizer], "lr": s.lr, "weight_decay": s.weight_decay}
    if t.optimizer == "adamw" and t.device == "cuda":
        opt["fused"] = True
    if t.optimizer == "sgd-momentum":
        opt["momentum"] = 0.9
    doc["optimizer"] = opt
    doc["lr_scheduler"] = {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                           "num_warmup_steps": s.warmup_steps}
    # the plan's loss materialises the logits; torchtune's chunked loss would use less memory than planned
    doc["loss"] = {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"} if t.loss == "chunked" else \
        {"_component_": "torch.nn.CrossEntropyLoss", "ignore_index": -100}
    if s.max_steps:
        # one epoch cut at max_steps optimizer steps (torchtune counts max_steps_per_epoch in optimizer steps)
        doc.update(epochs=1, max_steps_per_epoch=s.max_steps)
    else:
        doc.update(epochs=max(1, round(s.epochs or 1.0)), max_steps_per_epoch=None)
    doc.update(clip_grad_norm=s.max_grad_norm, compile=False, device="cpu" if t.device == "cpu" else "cuda",
               dtype=DTYPES[t.precision], enable_activation_checkpointing=t.grad_checkpointing != "none",
               enable_activation_offloading=bool(t.activation_offload))
    if t.num_gpus > 1:
        doc["fsdp_cpu_offload"] = t.offload != "none"
        doc["fsdp_reshard_after_forward"] = t.fsdp_strategy != "shard-grad-op"
    doc["metric_logger"] = {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": f"{out}/logs"}
    doc.update(log_every_n_steps=cfg.logging.every_steps, log_peak_memory_stats=t.device == "cuda")
    differs = [f"run: tune run {recipe(plan)} --config torchtune.yaml"
               + (f" (with --nproc_per_node {t.num_gpus})" if t.num_gpus > 1 else ""),
               "loss: torchtune's configs use CEWithChunkedOutputLoss (less logits memory); the plan's "
               f"{'chunked' if t.loss == 'chunked' else 'standard'} loss is set, as the memory figure assumes",
               "compile: False (torchtune's configs too); True is faster and smaller"]
    if cfg.method in ("lora", "qlora"):
        differs.append("lora_attn_modules / apply_lora_to_mlp: torchtune's configs adapt q, v, output_proj and the "
                       "MLP; the plan's targets are set")
    if t.precision in ("bf16-mixed", "fp16-mixed"):
        differs.append(f"dtype {DTYPES[t.precision]}: torchtune has no autocast; the weights are {DTYPES[t.precision]} "
                       f"(trainfit's {t.precision} keeps fp32 master weights)")
    if t.num_gpus > 1 and t.zero_stage and t.fsdp_strategy == "none":
        differs.append("sharding: torchtune's distributed recipes shard with FSDP2 (full shard), not DeepSpeed ZeRO")
    if hub:
        differs.append(f"checkpoint: `tune download {cfg.model.id} --output-dir {ckpt}` first; check checkpoint_files "
                       "against the .safetensors files it fetched")
    return {"torchtune.yaml": yaml_text(doc)}, differs
