"""training_args.yaml names the one class its keys are for, and that real class (trl / transformers)
accepts them as written; a pure 16-bit plan says so in the files (the weights' dtype), a mixed one
turns the autocast switches on (issue: headlines and files agree)."""

from __future__ import annotations

import importlib
import re

import pytest
import yaml

from trainfit.cli.cmd_plan import plan_for
from trainfit.export.plan_files import plan_files

CASES = [  # (model, method, hardware): the config class each method's run uses
    ("Qwen/Qwen2.5-0.5B", "lora", "a10g"), ("Qwen/Qwen2.5-0.5B", "qlora", "a10g"),
    ("Qwen/Qwen2.5-0.5B", "full", "a10g"), ("Qwen/Qwen2.5-0.5B", "dpo", "a10g"),
    ("Qwen/Qwen2.5-0.5B", "lora", "cpu"), ("shape:1m", "pretrain", "cpu"),
]
CLASSES = {"pretrain": "transformers.TrainingArguments", "dpo": "trl.DPOConfig"}


@pytest.mark.parametrize("model,method,hardware", CASES)
def test_training_args_load_in_the_class_their_header_names(model, method, hardware, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import transformers.training_args as ta

    # the plan is for a GPU; this test process has none: let TrainingArguments accept bf16 as a GPU would
    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda *a, **k: True)
    result, req = plan_for(model, method=method, hardware=hardware, examples=2000, mode=["balanced"])
    (mp,) = result.modes
    assert mp.fits and mp.setup.zero_stage == 0  # a DeepSpeed file would need DeepSpeed installed
    texts = plan_files(mp, req, "trainfit plan ...", None, base_dir=tmp_path)
    text = texts["training_args.yaml"]
    module, name = re.search(r"Keyword arguments of (\w+)\.(\w+)", text).groups()
    assert f"{module}.{name}" == CLASSES.get(method, "trl.SFTConfig")
    assert f"from {module} import {name}; {name}(**yaml.safe_load" in text
    cls = getattr(importlib.import_module(module), name)
    kwargs = yaml.safe_load(text)
    monkeypatch.chdir(tmp_path)
    config = cls(**kwargs)
    s = mp.setup
    assert config.bf16 is (s.precision == "bf16-mixed") and config.max_steps == mp.run.steps
    if s.precision in ("bf16", "fp16") and name != "TrainingArguments":
        assert config.model_init_kwargs == {"dtype": {"bf16": "bfloat16", "fp16": "float16"}[s.precision]}
    if name != "TrainingArguments":  # TRL's keys are not TrainingArguments': the README names the class
        import transformers

        with pytest.raises(TypeError, match="max_length"):
            transformers.TrainingArguments(**kwargs)


def test_readme_says_which_class_loads_training_args():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "`training_args.yaml` (" in x)
    assert "the one class its header names" in line and "`trl.SFTConfig`" in line and "`trl.DPOConfig`" in line
