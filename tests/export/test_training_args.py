"""training_args.yaml loads into the class its header names, with the values trainfit train uses."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from trainfit.export.training_args import (
    CONFIG_MODULES, NEEDS_BITSANDBYTES, OPTIM_NAMES, config_class_name, trainer_config, training_arguments,
)
from trainfit.versions import transformers_major

from .conftest import load_args, make_cfg


@pytest.mark.parametrize("method,cls", [("pretrain", "TrainingArguments"), ("sft", "SFTConfig"),
                                        ("lora", "SFTConfig"), ("dpo", "DPOConfig")])
def test_loads_into_the_named_class(bundle, method, cls):
    cfg = make_cfg(method, training={"optimizer": "sgd-momentum", "grad_checkpointing": "full", "dpo_beta": 0.3})
    out = bundle(cfg)
    name, kwargs, args = load_args(out / "training_args.yaml")
    assert name == cls and type(args).__name__ == cls
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.max_steps) == (2, 3, 7)
    assert args.optim.value == "sgd" and args.optim_args == "momentum=0.9" and args.use_cpu
    assert args.output_dir == "runs/tiny-run/checkpoints" and kwargs["activation_checkpointing"] is True
    if method != "pretrain":
        assert args.max_length == 64
    if method == "dpo":
        assert args.beta == 0.3 and args.precompute_ref_log_probs is False
    elif method != "pretrain":
        assert args.packing is False and args.dataset_text_field == "text"


def test_file_is_what_the_runner_builds(bundle):
    # make_trainer builds its config from trainer_config; the file is the same call with relative paths.
    cfg = make_cfg("lora", distributed={"strategy": "fsdp"}, training={"zero_stage": 3})
    out = bundle(cfg, num_processes=2)
    name, kwargs = trainer_config(cfg, device="cpu", output_dir="runs/tiny-run/checkpoints", world_size=2,
                                  transformers_major=transformers_major())
    assert yaml.safe_load((out / "training_args.yaml").read_text()) == kwargs and name == "SFTConfig"
    assert kwargs["ddp_backend"] == "gloo" and kwargs["fsdp"] is True
    assert kwargs["fsdp_config"] == {"version": 2, "reshard_after_forward": True, "cpu_offload": False}
    _, _, args = load_args(out / "training_args.yaml", drop=("ddp_backend",))
    assert args.fsdp_plugin_args["fsdp_version"] == 2 and args.fsdp_plugin_args["reshard_after_forward"] is True


def test_fsdp_accumulation_reduce_scatters_every_micro_batch(bundle):
    # The Trainer's default no_sync would keep every unit's unsharded gradient until the step.
    cfg = make_cfg("lora", distributed={"strategy": "fsdp"}, training={"zero_stage": 3, "grad_accum": 4})
    out = bundle(cfg, num_processes=2)
    _, _, args = load_args(out / "training_args.yaml", drop=("ddp_backend",))
    assert args.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}
    one = make_cfg("lora", distributed={"strategy": "fsdp"}, training={"zero_stage": 3, "grad_accum": 1})
    ddp = make_cfg("lora", distributed={"strategy": "ddp"}, training={"grad_accum": 4})
    for c in (one, ddp):
        _, kw = trainer_config(c, device="cpu", output_dir="out", world_size=2, transformers_major=transformers_major())
        assert "accelerator_config" not in kw


def test_cuda_multi_process_arguments(bundle):
    cfg = make_cfg("sft", training={"precision": "bf16-mixed"})
    out = bundle(cfg, num_processes=4, device="cuda")
    # No CUDA and no launched process group here: load the same arguments on the CPU, one process.
    _, kwargs, args = load_args(out / "training_args.yaml", drop=("ddp_backend",), use_cpu=True)
    assert kwargs["use_cpu"] is False and kwargs["ddp_backend"] == "nccl" and kwargs["bf16"] is True
    assert args.bf16 and not args.fp16 and args.ddp_find_unused_parameters is False


def test_deepspeed_file_is_referenced_relative(bundle):
    cfg = make_cfg("pretrain", distributed={"strategy": "deepspeed"}, training={"zero_stage": 2})
    out = bundle(cfg, num_processes=2, device="cuda")
    kwargs = yaml.safe_load((out / "training_args.yaml").read_text())
    assert kwargs["deepspeed"] == "deepspeed.json" and (out / "deepspeed.json").is_file()
    # The runner embeds the same config as a dict.
    runner = training_arguments(cfg, device="cuda", output_dir="x", world_size=2, transformers_major=5)
    assert runner["deepspeed"]["zero_optimization"]["stage"] == 2


def test_every_method_but_pretrain_and_dpo_is_sft():
    cfg = make_cfg("sft")
    for method in ("sft", "full", "lora", "qlora"):
        other = dataclasses.replace(cfg, method=method)
        assert config_class_name(other) == "SFTConfig"
        name, kwargs = trainer_config(other, device="cpu", output_dir="o", world_size=1, transformers_major=5)
        assert kwargs["dataset_text_field"] == "text" and CONFIG_MODULES[name] == "trl"


def test_version_dependent_forms():
    cfg = make_cfg("pretrain", distributed={"strategy": "fsdp"}, training={"zero_stage": 2, "offload": "optimizer",
                                                                          "grad_checkpointing": "selective"})
    v5 = training_arguments(cfg, device="cpu", output_dir="o", world_size=2, transformers_major=5)
    v4 = training_arguments(cfg, device="cpu", output_dir="o", world_size=2, transformers_major=4)
    assert v5["fsdp_config"] == {"version": 2, "reshard_after_forward": False, "cpu_offload": True}
    assert v4["fsdp"] == "shard_grad_op auto_wrap offload" and v4["fsdp_config"] == {"use_orig_params": True}
    assert v5["activation_checkpointing"] is True and "gradient_checkpointing" not in v5
    assert v4["gradient_checkpointing"] is True and "activation_checkpointing" not in v4


def test_optimizer_table_covers_every_optimizer():
    from typing import get_args

    from trainfit.core.setup import Optimizer

    assert set(OPTIM_NAMES) == set(get_args(Optimizer))
    assert NEEDS_BITSANDBYTES <= set(OPTIM_NAMES)
    epochs = make_cfg("pretrain", schedule={"max_steps": None, "epochs": 1.5})
    kw = training_arguments(epochs, device="cpu", output_dir="o", world_size=1, transformers_major=5)
    assert kw["num_train_epochs"] == 1.5 and "max_steps" not in kw and "ddp_backend" not in kw


@pytest.mark.parametrize("method", ["pretrain", "sft", "lora", "dpo"])
@pytest.mark.parametrize("strategy", ["auto", "ddp", "fsdp", "deepspeed"])
@pytest.mark.parametrize("procs,device", [(1, "cpu"), (2, "cpu"), (2, "cuda")])
def test_every_combination_loads(bundle, method, strategy, procs, device):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")  # TrainingArguments(deepspeed=...) imports it
    cfg = make_cfg(method, distributed={"strategy": strategy}, training={"zero_stage": 3, "offload": "optimizer"})
    out = bundle(cfg, num_processes=procs, device=device)
    _, kwargs, args = load_args(out / "training_args.yaml", drop=("ddp_backend",), use_cpu=True)
    assert ("ddp_backend" in kwargs) is (procs > 1) and kwargs["use_cpu"] is (device == "cpu")
    assert bool(args.fsdp) is (strategy == "fsdp") and (args.deepspeed is not None) is (strategy == "deepspeed")


def test_adamw_on_a_gpu_is_the_fused_kernel():
    """The foreach kernel ("adamw_torch" on CUDA) allocates a second-moment-sized temporary at each
    step that the memory model does not charge: GPU runs use the fused kernel, as Transformers does."""
    from trainfit.export.training_args import optim_name
    from trainfit.config.run_config import parse_run_config

    def training(**t):
        return parse_run_config({"version": 1, "method": "full", "model": {"shape": {"layers": 2, "hidden": 64,
                                 "heads": 4}}, "data": {"paths": ["builtin:tiny-chat"]}, "schedule": {"max_steps": 1},
                                 "training": t}, source="t.yaml").training

    assert optim_name(training(), device="cuda", deepspeed=False) == "adamw_torch_fused"
    assert optim_name(training(), device="cpu", deepspeed=False) == "adamw_torch"
    assert optim_name(training(), device="cuda", deepspeed=True) == "adamw_torch"
    assert optim_name(training(optimizer="sgd"), device="cuda", deepspeed=False) == "sgd"
