"""The run config and exported files for the sharding / offload knobs: what the
real tools are given, and the run-config refusals (key named, fix given)."""

from __future__ import annotations

import pytest

from trainfit.errors import BadInputError
from trainfit.export.accelerate_config import accelerate_config
from trainfit.export.training_args import NEEDS_BITSANDBYTES, OPTIM_NAMES, trainer_config

from .conftest import load_args, make_cfg


def test_paged_adamw_32bit_is_the_trainer_optim(bundle):
    cfg = make_cfg("sft", training={"optimizer": "paged-adamw-32bit"})
    assert OPTIM_NAMES["paged-adamw-32bit"] == "paged_adamw_32bit" and "paged-adamw-32bit" in NEEDS_BITSANDBYTES
    _, kwargs, args = load_args(bundle(cfg) / "training_args.yaml")
    assert kwargs["optim"] == "paged_adamw_32bit" and args.optim.value == "paged_adamw_32bit"


@pytest.mark.parametrize("method", ["sft", "lora", "dpo"])
def test_activation_offload_is_trls_key(bundle, method):
    cfg = make_cfg(method, training={"activation_offload": True})
    name, kwargs, args = load_args(bundle(cfg) / "training_args.yaml")
    assert kwargs["activation_offloading"] is True and args.activation_offloading is True
    plain = trainer_config(make_cfg(method), device="cpu", output_dir="o", world_size=1, transformers_major=5)[1]
    assert "activation_offloading" not in plain  # unset: the files stay what they were


def test_fsdp_full_shard_with_cpu_offload_exports_both_forms():
    cfg = make_cfg("sft", distributed={"strategy": "fsdp"},
                   training={"fsdp_strategy": "full-shard", "zero_stage": 3, "offload": "optimizer+params"})
    for major, want in ((5, {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True,
                                                            "cpu_offload": True}}),
                        (4, {"fsdp": "full_shard auto_wrap offload", "fsdp_config": {"use_orig_params": True}})):
        kw = trainer_config(cfg, device="cuda", output_dir="o", world_size=2, transformers_major=major)[1]
        assert {k: kw[k] for k in want} == want
    acc = accelerate_config(cfg, num_processes=2, device="cuda", transformers_major=4)
    assert acc["distributed_type"] == "FSDP" and acc["fsdp_config"]["fsdp_offload_params"] is True
    assert acc["fsdp_config"]["fsdp_reshard_after_forward"] == "FULL_SHARD"
    grad_op = make_cfg("sft", distributed={"strategy": "fsdp"}, training={"fsdp_strategy": "shard-grad-op",
                                                                          "zero_stage": 2})
    kw = trainer_config(grad_op, device="cuda", output_dir="o", world_size=2, transformers_major=4)[1]
    assert kw["fsdp"] == "shard_grad_op auto_wrap"


@pytest.mark.parametrize("method, sections, needle", [
    ("sft", {"training": {"fsdp_strategy": "full-shard", "zero_stage": 3}}, "distributed.strategy: fsdp"),
    ("sft", {"distributed": {"strategy": "fsdp"}, "training": {"fsdp_strategy": "full-shard"}}, "zero_stage: 3"),
    ("sft", {"distributed": {"strategy": "fsdp"}, "training": {"fsdp_strategy": "no-shard"}}, "DDP"),
    ("sft", {"distributed": {"strategy": "fsdp"},
             "training": {"fsdp_strategy": "full-shard", "zero_stage": 3, "offload": "optimizer"}},
     "offload: optimizer\\+params"),
    ("sft", {"distributed": {"strategy": "deepspeed"}, "training": {"offload": "optimizer"}}, "zero_stage >= 1"),
    ("sft", {"training": {"offload": "optimizer"}}, "paged-adamw-32bit"),
    ("pretrain", {"training": {"activation_offload": True}}, "training.activation_offload"),
    ("sft", {"training": {"activation_offload": True, "device": "cpu"}}, "device 'cpu'"),
    ("sft", {"training": {"optimizer_in_backward": True}}, "training.optimizer_in_backward"),
    ("sft", {"training": {"optimizer_in_backward": True}}, "schedule.max_grad_norm"),
    ("sft", {"training": {"optimizer_in_backward": True, "grad_accum": 3}}, "training.grad_accum"),
])
def test_run_config_refusals_name_the_key(method, sections, needle):
    with pytest.raises(BadInputError, match=needle):
        make_cfg(method, **sections)


def test_knobs_leave_the_config_hash_alone():
    """Where states and activations live is how a step runs, not what it computes (HOW_NOT_WHAT)."""
    base = make_cfg("sft", distributed={"strategy": "fsdp"}, training={"zero_stage": 3})
    knobs = make_cfg("sft", distributed={"strategy": "fsdp"},
                     training={"zero_stage": 3, "fsdp_strategy": "full-shard", "activation_offload": True})
    assert base.config_hash() == knobs.config_hash()
