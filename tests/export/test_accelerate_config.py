"""accelerate.yaml loads through Accelerate's own loader and launch validation, and its FSDP /
DeepSpeed settings agree with what the Trainer builds from training_args.yaml."""

from __future__ import annotations

import os

import pytest
import yaml

from trainfit.errors import BadInputError
from trainfit.export.accelerate_config import accelerate_config

from .conftest import HEADER, make_cfg, runnable_here

pytest.importorskip("accelerate")
from accelerate.commands.config.config_args import load_config_from_file  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402


def launch_args(config_file: str):
    """Accelerate's launch arguments for this config file, as `accelerate launch` validates them."""
    args = launch_command_parser().parse_args(["--config_file", config_file, "-m", "trainfit", "train", "run.yaml"])
    return _validate_launch_command(args)


@pytest.mark.parametrize("strategy,procs,device,precision,dist,mixed", [
    ("auto", 1, "cpu", "fp32", "NO", "no"),
    ("auto", 1, "cuda", "bf16-mixed", "NO", "bf16"),
    ("ddp", 2, "cpu", "bf16-mixed", "MULTI_CPU", "bf16"),
    ("auto", 4, "cuda", "fp16-mixed", "MULTI_GPU", "fp16"),
    ("auto", 2, "cuda", "bf16", "MULTI_GPU", "no"),  # pure bf16 casts the weights: no autocast
    ("fsdp", 2, "cuda", "bf16-mixed", "FSDP", "bf16"),
    ("deepspeed", 2, "cuda", "bf16-mixed", "DEEPSPEED", None),
])
def test_loads_with_accelerate(bundle, strategy, procs, device, precision, dist, mixed):
    cfg = make_cfg("pretrain", distributed={"strategy": strategy}, training={"precision": precision, "zero_stage": 2})
    out = bundle(cfg, num_processes=procs, device=device)
    text = (out / "accelerate.yaml").read_text()
    assert text.startswith("".join(f"# {h}\n" for h in HEADER))
    conf = load_config_from_file(str(out / "accelerate.yaml"))
    assert conf.distributed_type.value == dist and conf.num_processes == procs
    assert conf.mixed_precision == mixed and conf.use_cpu is (device == "cpu")
    args, defaults, mixed_from_file = launch_args("accelerate.yaml")
    assert args.num_processes == procs and args.use_fsdp is (dist == "FSDP")
    assert args.use_deepspeed is (dist == "DEEPSPEED") and args.multi_gpu is (dist == "MULTI_GPU")


@pytest.mark.parametrize("zero,offload", [(3, "none"), (2, "optimizer"), (0, "optimizer+params")])
def test_fsdp_block_matches_the_trainer_plugin(bundle, zero, offload):
    from accelerate.utils.launch import prepare_multi_gpu_env
    from transformers import TrainingArguments

    cfg = make_cfg("pretrain", distributed={"strategy": "fsdp"}, training={"zero_stage": zero, "offload": offload})
    out = bundle(cfg, num_processes=2, device="cuda")
    env = prepare_multi_gpu_env(launch_args("accelerate.yaml")[0])  # what `accelerate launch` exports
    kwargs = yaml.safe_load((out / "training_args.yaml").read_text())
    plugin = TrainingArguments(**runnable_here(kwargs)).fsdp_plugin_args
    assert env["FSDP_VERSION"] == str(plugin["fsdp_version"])
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(plugin["reshard_after_forward"]).lower()
    assert env["FSDP_OFFLOAD_PARAMS"] == str(plugin.get("cpu_offload", False)).lower()
    assert env["FSDP_AUTO_WRAP_POLICY"] == plugin["auto_wrap_policy"]
    assert env["FSDP_STATE_DICT_TYPE"] == plugin["state_dict_type"]
    assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == str(plugin["cpu_ram_efficient_loading"]).lower()


def test_fsdp1_block_for_transformers_4():
    cfg = make_cfg("pretrain", distributed={"strategy": "fsdp"}, training={"zero_stage": 3})
    block = accelerate_config(cfg, num_processes=2, device="cuda", transformers_major=4)["fsdp_config"]
    assert block["fsdp_version"] == 1 and block["fsdp_reshard_after_forward"] == "FULL_SHARD"


def test_deepspeed_config_file_passes_accelerates_checks(bundle, monkeypatch):
    """With a deepspeed_config_file, Accelerate refuses DeepSpeed settings (mixed_precision
    included) that also come from its config file; ours has none."""
    pytest.importorskip("deepspeed")  # TrainingArguments(deepspeed=...) needs it
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments

    cfg = make_cfg("pretrain", distributed={"strategy": "deepspeed"},
                   training={"zero_stage": 3, "precision": "bf16-mixed"})
    out = bundle(cfg, num_processes=2, device="cuda")
    args, defaults, mixed_from_file = launch_args("accelerate.yaml")
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mixed_from_file else [])
    assert fields == ["deepspeed_config_file"] and defaults.deepspeed_config["deepspeed_config_file"] == "deepspeed.json"
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields))  # as accelerate launch sets it
    kwargs = yaml.safe_load((out / "training_args.yaml").read_text())
    targs = TrainingArguments(**runnable_here(kwargs))
    plugin = DeepSpeedPlugin(hf_ds_config=targs.hf_deepspeed_config)
    assert plugin.zero_stage == 3 and os.path.isfile(defaults.deepspeed_config["deepspeed_config_file"])


def test_several_processes_need_cuda_or_cpu():
    with pytest.raises(BadInputError, match="mps"):
        accelerate_config(make_cfg("pretrain"), num_processes=2, device="mps", transformers_major=5)
    with pytest.raises(ValueError, match="resolved device"):
        accelerate_config(make_cfg("pretrain"), num_processes=1, device="auto", transformers_major=5)
