"""DPO on a quantized base (the planner's "DPO with QLoRA"): method dpo with training.lora and
training.quant loads, its reference is the base with the adapters off, and on a machine without
CUDA it stops with exit 4 before any work, like qlora."""

from __future__ import annotations

import pytest

from trainfit.config.run_config import parse_run_config
from trainfit.errors import BadInputError, UnavailableError
from trainfit.train.trainer_setup import check_method_available, quantized_base

BASE = {"version": 1, "method": "dpo", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
        "data": {"paths": ["builtin:tiny-preferences"]}, "schedule": {"max_steps": 2}}


def _cfg(**training):
    return parse_run_config({**BASE, "training": training}, source="test.yaml")


def test_dpo_with_lora_on_a_4bit_base_is_a_quantized_run():
    cfg = _cfg(lora={"rank": 8}, quant="nf4-dq", dpo_reference="lora-base")
    assert quantized_base(cfg) and cfg.to_setup().quant == "nf4-dq"
    assert not quantized_base(_cfg(lora={"rank": 8}, dpo_reference="lora-base"))


@pytest.mark.parametrize("training,key", [
    ({"quant": "nf4"}, "training.quant: dpo on a nf4 base trains LoRA adapters"),
    ({"quant": "nf4", "lora": {"rank": 8}, "dpo_reference": "separate"}, "training.dpo_reference: with training.quant"),
])
def test_refused_combinations_name_the_key(training, key):
    with pytest.raises(BadInputError) as err:
        _cfg(**training)
    assert key in str(err.value)


def test_needs_cuda_and_bitsandbytes():
    cfg = _cfg(lora={"rank": 8}, quant="nf4-dq", dpo_reference="lora-base")
    with pytest.raises(UnavailableError) as err:
        check_method_available(cfg, "cpu")
    assert "method dpo on a nf4-dq base needs a CUDA GPU" in str(err.value)
