"""The run config for the loss-kernel, DoRA, GPTQ/AWQ and image knobs: refused by key where the
trainer cannot run them, hashed only when set, and DoRA really training through PEFT."""

from __future__ import annotations

import json

import pytest

from trainfit.config.run_config import load_run_config, parse_run_config
from trainfit.errors import BadInputError

BASE = {"version": 1, "method": "lora", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
        "data": {"paths": ["builtin:tiny-corpus"]}, "schedule": {"max_steps": 3}}


def _cfg(method="lora", **training):
    raw = json.loads(json.dumps(BASE))
    raw["method"] = method
    raw["training"] = training
    return parse_run_config(raw, source="x")


@pytest.mark.parametrize("training, needle", [
    ({"loss": "fused"}, "training.loss"),
    ({"loss": "chunked"}, "training.loss"),
    ({"quant": "gptq"}, "training.quant"),
    ({"image_size": 448, "images_per_example": 1}, "training.image_size"),
])
def test_knobs_the_trainer_cannot_run_are_refused_by_key(training, needle):
    with pytest.raises(BadInputError, match=needle):
        _cfg("qlora" if "quant" in training else "lora", **training)


def test_dora_needs_lora_and_is_hashed_only_when_set():
    with pytest.raises(BadInputError, match="training.dora"):
        _cfg("sft", dora=True)
    plain, dora = _cfg(), _cfg(dora=True)
    assert plain.config_hash() == _cfg(dora=False, images_per_example=0).config_hash()
    assert dora.config_hash() != plain.config_hash()


def test_loss_kernel_is_not_part_of_the_hash():
    from trainfit.config.run_config import HASHED_WHEN_SET, HOW_NOT_WHAT

    assert "loss" in HOW_NOT_WHAT and {"dora", "image_size", "images_per_example"} <= set(HASHED_WHEN_SET)


def test_peft_kwargs_carry_use_dora():
    from trainfit.export.peft_config import lora_config_kwargs

    assert lora_config_kwargs(_cfg(dora=True))["use_dora"] is True
    assert "use_dora" not in lora_config_kwargs(_cfg())  # lora.yaml of plain LoRA runs unchanged


def test_dora_trains_through_peft(tmp_path):
    pytest.importorskip("peft")
    import yaml

    from trainfit.train.runner import run_training

    raw = json.loads(json.dumps(BASE))
    raw["training"] = {"dora": True, "seq_len": 32, "micro_batch": 2, "precision": "fp32",
                       "lora": {"rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}}
    raw["tokenizer"] = {"vocab_size": 512}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    result = run_training(load_run_config(path), tmp_path / "run", quiet=True)
    assert result.global_step == 3
    adapter = json.loads((tmp_path / "run" / "final" / "adapter_config.json").read_text())
    assert adapter["use_dora"] is True
