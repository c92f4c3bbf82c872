"""What one attempt's Trainer is made of: the tokenizer (given, from the Hub, or trained on the
corpus), the dataset, the model (PEFT-wrapped, a quantized base), the Trainer for the method;
and whether the method runs on this device. The Trainer arguments come from
trainfit.export.training_args: what is exported runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from trainfit.config.run_config import RunConfig
from trainfit.errors import BadInputError, UnavailableError, require_extra
from trainfit.export.engine import sharding_engine
from trainfit.export.training_args import CONFIG_MODULES, NEEDS_BITSANDBYTES
from trainfit.train.in_force import InForce

Log = Callable[[str], None]


def check_method_available(cfg: RunConfig, device: str) -> None:
    """QLoRA and 8-bit optimizers need CUDA + bitsandbytes: exit 4 with the reason otherwise."""
    import importlib.util

    t = cfg.training
    if quantized_base(cfg) or t.optimizer in NEEDS_BITSANDBYTES:
        what = ("method qlora" if cfg.method == "qlora" else f"method dpo on a {t.quant} base" if quantized_base(cfg)
                else f"training.optimizer {t.optimizer}")
        if device != "cuda":
            raise UnavailableError(f"{what} needs a CUDA GPU (bitsandbytes kernels); this run's device is {device}",
                                   hint="use method lora (or optimizer adamw) on this machine")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise UnavailableError(f"{what} needs bitsandbytes", hint="pip install bitsandbytes")
    if cfg.training.precision.startswith("fp16") and device == "cpu":
        raise BadInputError("training.precision: fp16 does not train on CPU (valid there: fp32, bf16-mixed, bf16)")
    if sharding_engine(cfg) == "deepspeed":
        require_extra("deepspeed", "deepspeed")


def get_tokenizer(cfg: RunConfig, run_dir: Path, args, log: Log):
    from trainfit.train.data import check_columns, load_raw_dataset, text_iterator
    from trainfit.train.tokenizer import has_tokenizer_files, load_tokenizer, train_bpe_tokenizer

    saved = run_dir / RUN_TOKENIZER_DIR
    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path), f"local: {cfg.tokenizer.path}"
    if cfg.model.weights == "hub":
        return load_tokenizer(cfg.model.id, "model.id", hub=True), f"hub: {cfg.model.id}"
    if cfg.model.path and has_tokenizer_files(cfg.model.path):
        return load_tokenizer(cfg.model.path, "model.path"), f"local: {cfg.model.path}"
    with args.main_process_first(local=False, desc="tokenizer"):
        if has_tokenizer_files(saved):
            tok, note = _load_saved_tokenizer(saved), f"trained on the corpus earlier in this run ({saved})"
        else:
            log(f"training a byte-level BPE tokenizer ({cfg.tokenizer.vocab_size} tokens) on the corpus")
            raw = load_raw_dataset(cfg)
            check_columns(cfg, raw)  # before spending time on the tokenizer
            train_bpe_tokenizer(text_iterator(cfg, raw, cfg.tokenizer.train_max_bytes),
                                      cfg.tokenizer.vocab_size, saved)
            tok, note = load_tokenizer(saved), "byte-level BPE trained on the corpus"
    from trainfit.train.model_build import short_vocabulary_note

    short = short_vocabulary_note(cfg, len(tok))
    if short:  # the model is still built at the planned size; the user learns what the corpus gave
        log(f"warning: {short}")
        note += f"; {short}"
    return tok, note


RUN_TOKENIZER_DIR = "tokenizer"


def _load_saved_tokenizer(saved: Path):
    """The tokenizer this run trained and saved; a damaged one names itself and the way out (the
    run's token ids depend on it, so it cannot silently be retrained under a resumed run)."""
    from trainfit.train.tokenizer import load_tokenizer

    try:
        return load_tokenizer(saved, key="the run's tokenizer")
    except BadInputError as exc:
        detail = exc.message.split(f"{saved}: ", 1)[-1]
        raise BadInputError(f"the tokenizer this run trained on its corpus ({saved}) is damaged: {detail}",
                            hint=f"restore {saved} from a backup, or start the run again with another --out") from None

def build_dataset(in_force: InForce, tokenizer, args, log: Log = lambda m: None):
    """The training dataset, once the data keys this machine cannot honour are adjusted in the
    config in force (a recorded change): trainfit.train.data.for_this_machine and
    build_train_dataset (caches, streaming, packing)."""
    from trainfit.train.data import build_train_dataset, for_this_machine

    cfg, notes = for_this_machine(in_force.cfg)
    for note in notes:
        log(note)
    in_force.change(cfg, "; ".join(notes), source="data")
    with args.main_process_first(local=False, desc="dataset"):
        return build_train_dataset(in_force.cfg, tokenizer)


def quantized_base(cfg: RunConfig) -> bool:
    """The base model is loaded quantized: qlora, or dpo with training.quant (LoRA on a 4/8-bit base)."""
    return cfg.method == "qlora" or (cfg.method == "dpo" and cfg.training.quant != "none")


def _quantization(cfg: RunConfig):
    if not quantized_base(cfg):
        return None
    import torch
    from transformers import BitsAndBytesConfig

    quant = cfg.training.quant if cfg.training.quant != "none" else "nf4-dq"
    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=quant == "nf4-dq",
                              bnb_4bit_compute_dtype=torch.bfloat16)


def make_model(cfg: RunConfig, tokenizer, run_dir: Path, log: Log, args=None):
    """The model to train (PEFT-wrapped for lora/qlora), its reference for DPO, and the BuiltModel.
    `args` (TrainingArguments) lets the main process write random-init/ before the others read it."""
    import copy

    import torch

    from trainfit.export.peft_config import uses_lora
    from trainfit.train.model_build import build_model, lora_config

    qconf = _quantization(cfg)
    if qconf is not None and cfg.model.weights == "random":
        # bitsandbytes quantizes while loading: save the random init once, then load it quantized.
        if args is not None:
            with args.main_process_first(local=False, desc="random init"):
                init_dir = save_random_init(cfg, tokenizer, run_dir / "random-init")
        else:
            init_dir = save_random_init(cfg, tokenizer, run_dir / "random-init")
        from transformers import AutoModelForCausalLM

        built = build_model(cfg, tokenizer)
        built = type(built)(AutoModelForCausalLM.from_pretrained(str(init_dir), quantization_config=qconf),
                            built.spec, built.spec_note, built.weights, built.hf_config)
    else:
        built = build_model(cfg, tokenizer, quantization_config=qconf)
    model = built.model
    if cfg.training.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if cfg.training.precision == "bf16" else torch.float16)
    ref = None
    use_lora = uses_lora(cfg)
    if cfg.method == "dpo" and cfg.training.dpo_reference == "separate":
        ref = copy.deepcopy(model).eval()  # a frozen copy of the starting weights
        for p in ref.parameters():
            p.requires_grad_(False)
    if use_lora:
        from peft import get_peft_model

        if qconf is not None:
            prepare_quantized_base(model, gradient_checkpointing=cfg.training.grad_checkpointing != "none")
        model = get_peft_model(model, lora_config(cfg))
    log(f"model: {built.spec.id if built.spec else cfg.model.path} weights {built.weights}; "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable")
    return model, ref, built


def prepare_quantized_base(model, *, gradient_checkpointing: bool) -> None:
    """PEFT's prepare_model_for_kbit_training without its fp32 cast: the base frozen and, with
    checkpointing, the input embeddings made to require grad (reentrant checkpointing needs an input
    with a gradient). PEFT also casts every non-quantised weight to fp32, which for Llama 3 8B is
    2.1 GB more and an fp32 residual stream; the memory model counts that only for tools that do it
    (TrainingSetup.kbit_upcast)."""
    for param in model.parameters():
        param.requires_grad_(False)
    if gradient_checkpointing:
        model.enable_input_require_grads()
        model.gradient_checkpointing_enable()


def is_complete_model_dir(path: Path) -> bool:
    """config.json and every weights file it needs (one file, or all shards of an index)."""
    if not (path / "config.json").is_file():
        return False
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index).is_file():
            try:
                shards = set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return bool(shards) and all(isinstance(f, str) and (path / f).is_file() for f in shards)
    return (path / "model.safetensors").is_file() or (path / "pytorch_model.bin").is_file()


def save_random_init(cfg: RunConfig, tokenizer, init_dir: Path) -> Path:
    """The run's random initial weights saved once (atomically: the directory appears complete or
    not at all). An incomplete one, left by an older version, is written again: it is made from
    the run's seed, so the content is the same."""
    from trainfit.files import atomic_dir
    from trainfit.train.model_build import build_model

    if is_complete_model_dir(init_dir):
        return init_dir
    try:
        with atomic_dir(init_dir, replace=init_dir.exists()) as tmp:
            build_model(cfg, tokenizer).model.save_pretrained(str(tmp))
    except FileExistsError:
        pass  # another process of this run published the same (seeded) weights first
    return init_dir


def make_trainer(cfg: RunConfig, model, ref, tokenizer, dataset, trainer_args: tuple[str, dict], callbacks: list,
                 log: Log, ckpt_dir: Path):
    """The Trainer for the method; trainer_args is trainfit.export.training_args.trainer_config's
    (config class name, kwargs), the same pair training_args.yaml is written from."""
    import importlib

    from transformers import Trainer, default_data_collator

    from trainfit.train.trainer_ext import with_trainfit

    config_name, kwargs = trainer_args
    # A NaN / inf loss is logged as what it is: Transformers' filter would log the average of the
    # earlier steps instead, and metrics.jsonl (and `trainfit report`) would show a healthy run.
    kwargs = {**kwargs, "logging_nan_inf_filter": False}
    args = getattr(importlib.import_module(CONFIG_MODULES[config_name]), config_name)(**kwargs)
    keep = cfg.checkpointing.keep_last
    if cfg.method == "pretrain":
        cls = with_trainfit(Trainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
        return cls(model=model, args=args, train_dataset=dataset,
                   data_collator=default_data_collator, processing_class=tokenizer, callbacks=callbacks)
    if cfg.method == "dpo":
        from trl import DPOTrainer

        cls = with_trainfit(DPOTrainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
        return cls(model=model, ref_model=ref, args=args, train_dataset=dataset, processing_class=tokenizer,
                   callbacks=callbacks)
    from trl import SFTTrainer  # every other method: full fine-tuning, lora, qlora

    cls = with_trainfit(SFTTrainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
