"""deepspeed.json: a schema check that needs no DeepSpeed, and DeepSpeed's own parser when it is
installed (after Transformers has filled the "auto" values, as it does before training)."""

from __future__ import annotations

import json

import pytest
import yaml

from trainfit.export.deepspeed import AUTO, AUTO_KEYS, HEADER_KEY, deepspeed_config

from .conftest import HEADER, load_args, make_cfg

CASES = [(0, "none"), (1, "none"), (2, "optimizer"), (3, "optimizer+params")]


def value(conf: dict, dotted: str):
    for part in dotted.split("."):
        conf = conf[part]
    return conf


def filled(out) -> dict:
    """The config after Transformers' trainer_config_process, from training_args.yaml."""
    _, _, args = load_args(out / "training_args.yaml", drop=("ddp_backend",), use_cpu=True)
    return args.hf_deepspeed_config.config


@pytest.mark.parametrize("zero,offload", CASES)
def test_schema(bundle, zero, offload):
    cfg = make_cfg("pretrain", distributed={"strategy": "deepspeed"}, training={"zero_stage": zero, "offload": offload})
    conf = json.loads((bundle(cfg, num_processes=2, device="cuda") / "deepspeed.json").read_text())
    assert next(iter(conf)) == HEADER_KEY and conf[HEADER_KEY][:len(HEADER)] == HEADER
    assert all(isinstance(line, str) for line in conf[HEADER_KEY])
    assert set(conf) == {HEADER_KEY, "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                         "train_batch_size", "gradient_clipping", "zero_optimization", "bf16", "fp16"}
    for key in AUTO_KEYS:  # TrainingArguments owns these values
        assert value(conf, key) == AUTO, key
    zero_conf = conf["zero_optimization"]
    assert zero_conf["stage"] == zero and isinstance(zero_conf["stage"], int)
    assert zero_conf["overlap_comm"] is True and zero_conf["contiguous_gradients"] is True
    assert ("offload_optimizer" in zero_conf) is (offload != "none")
    assert ("offload_param" in zero_conf) is (offload == "optimizer+params")
    for section in ("offload_optimizer", "offload_param"):
        if section in zero_conf:
            assert zero_conf[section] == {"device": "cpu", "pin_memory": True}
    assert {k: v for k, v in conf.items() if k != HEADER_KEY} == deepspeed_config(cfg)


def test_transformers_fills_every_auto(bundle):
    pytest.importorskip("deepspeed")  # TrainingArguments(deepspeed=...) needs it
    cfg = make_cfg("sft", distributed={"strategy": "deepspeed"}, training={"zero_stage": 2, "precision": "bf16-mixed"})
    conf = filled(bundle(cfg, num_processes=2, device="cuda"))
    assert conf["train_micro_batch_size_per_gpu"] == 2 and conf["gradient_accumulation_steps"] == 3
    assert conf["train_batch_size"] == 2 * 3 * 1  # world size 1 in this process
    assert conf["gradient_clipping"] == 1.0 and conf["bf16"]["enabled"] is True and conf["fp16"]["enabled"] is False
    assert AUTO not in json.dumps({k: v for k, v in conf.items() if k != HEADER_KEY})


def test_written_only_when_deepspeed_is_the_engine(bundle):
    # strategy auto with zero_stage > 0 runs DDP in trainfit train, so no DeepSpeed file is exported.
    for strategy, expected in (("auto", False), ("ddp", False), ("fsdp", False), ("deepspeed", True)):
        cfg = make_cfg("pretrain", distributed={"strategy": strategy}, training={"zero_stage": 2})
        out = bundle(cfg, num_processes=2, device="cuda")
        assert (out / "deepspeed.json").is_file() is expected, strategy
        assert ("deepspeed" in yaml.safe_load((out / "training_args.yaml").read_text())) is expected


@pytest.mark.parametrize("zero,offload", CASES)
def test_deepspeed_accepts_it(bundle, zero, offload):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = make_cfg("dpo", distributed={"strategy": "deepspeed"},
                   training={"zero_stage": zero, "offload": offload, "precision": "bf16-mixed"})
    out = bundle(cfg, num_processes=2, device="cuda")
    raw = json.loads((out / "deepspeed.json").read_text())
    DeepSpeedZeroConfig(**raw["zero_optimization"])  # strict pydantic model: unknown keys are errors
    # Without a process group DeepSpeedConfig takes world size 1; it checks the batch arithmetic.
    ds = DeepSpeedConfig(filled(out))  # the header key included
    assert ds.zero_optimization_stage == zero and ds.train_batch_size == 6 and ds.bfloat16_config.enabled
    assert ds.zero_config.offload_optimizer is None or ds.zero_config.offload_optimizer.device == "cpu"
    assert (ds.zero_config.offload_param is not None) is (offload == "optimizer+params")
