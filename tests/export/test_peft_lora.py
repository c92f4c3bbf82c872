"""lora.yaml loads into peft.LoraConfig; it is written exactly when the method trains adapters."""

from __future__ import annotations

import pytest
import yaml

from trainfit.export.peft_config import lora_config_kwargs, uses_lora

from .conftest import HEADER, make_cfg

peft = pytest.importorskip("peft")


def test_lora_yaml_loads_with_peft(bundle):
    cfg = make_cfg("lora", training={"lora": {"rank": 4, "alpha": 8, "dropout": 0.1,
                                              "target_modules": ["q_proj", "v_proj"]}})
    out = bundle(cfg)
    text = (out / "lora.yaml").read_text()
    assert text.startswith("".join(f"# {h}\n" for h in HEADER)) and "peft.LoraConfig" in text
    conf = peft.LoraConfig(**yaml.safe_load(text))
    assert (conf.r, conf.lora_alpha, conf.lora_dropout, conf.bias) == (4, 8, 0.1, "none")
    assert conf.target_modules == {"q_proj", "v_proj"} and conf.task_type == "CAUSAL_LM"


def test_all_linear_stays_a_string(bundle):
    out = bundle(make_cfg("dpo", training={"lora": {"target_modules": ["all-linear"]}}))
    kwargs = yaml.safe_load((out / "lora.yaml").read_text())
    assert kwargs["target_modules"] == "all-linear"
    assert peft.LoraConfig(**kwargs).target_modules == "all-linear"


def test_defaults_when_the_section_is_absent():
    from trainfit.core.setup import LoraSettings

    d = LoraSettings()
    kw = lora_config_kwargs(make_cfg("lora"))
    assert (kw["r"], kw["lora_alpha"], kw["lora_dropout"], kw["target_modules"]) == (
        d.rank, d.alpha, d.dropout, list(d.target_modules))


@pytest.mark.parametrize("method,lora,expected", [("pretrain", None, False), ("sft", None, False),
                                                  ("lora", None, True), ("dpo", None, False),
                                                  ("dpo", {"rank": 8}, True)])
def test_written_only_for_adapter_training(bundle, method, lora, expected):
    cfg = make_cfg(method, training={"lora": lora} if lora else {})
    assert uses_lora(cfg) is expected
    assert (bundle(cfg) / "lora.yaml").is_file() is expected
