"""Load an exported tool config with that tool's own parser, and the command that starts a short
run of it on CPU. Used by tests/export/test_tool_exports.py (in-process, when the tool is
importable) and bench/tool_exports.py (in each tool's own environment: python bench/_tool_checks.py
parse TOOL FILE prints one JSON line).

The parsers:
    axolotl        axolotl.utils.config.validate_config (the pydantic AxolotlInputConfig model that
                   `axolotl train` validates with), given the capabilities of the plan's GPU
    llama-factory  llamafactory.hparams.get_train_args (HfArgumentParser over its dataclasses, then its
                   checks) for a plan of this machine; for a GPU plan the HfArgumentParser parse alone
                   (get_train_args' checks ask the machine it runs on for the GPU)
    torchtune      torchtune.config's validate (`tune validate`), then instantiate the model, tokenizer and
                   dataset components
    litgpt         LitGPT's jsonargparse CLI parser (`litgpt finetune_lora --config FILE`), its classes
                   instantiated and the fine-tune script's validate_args
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

# Capabilities of an Ada / Hopper class GPU for Axolotl's validation of a CUDA plan on a CPU machine
# (what axolotl.cli.config.gpu_capabilities would report there).
AXOLOTL_GPU = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 1, "compute_capability": "sm_89"}


def parse_axolotl(path: Path) -> dict[str, Any]:
    import torch
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault

    raw = yaml.safe_load(path.read_text())
    caps = {**AXOLOTL_GPU, "bf16": bool(raw.get("bf16")) or AXOLOTL_GPU["bf16"]}
    out = validate_config(DictDefault(raw), capabilities=caps,
                          env_capabilities={"torch_version": torch.__version__.split("+")[0]})
    return {k: out.get(k) for k in ("adapter", "load_in_4bit", "lora_r", "lora_target_modules", "micro_batch_size",
                                    "gradient_accumulation_steps", "sequence_len", "optimizer", "max_steps")}


def parse_llama_factory(path: Path) -> dict[str, Any]:
    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")  # its version pins are checked by its installer
    raw = yaml.safe_load(path.read_text())
    if raw.get("use_cpu"):
        from llamafactory.hparams import get_train_args

        model, data, train, tune, _ = get_train_args(dict(raw))
    else:
        import transformers.training_args as ta
        from llamafactory.hparams.parser import _parse_train_args

        # a GPU plan parsed on a CPU machine: TrainingArguments asks the machine whether bf16 runs
        # here; answer as the plan's GPU would
        ta.is_torch_bf16_gpu_available = lambda *a, **k: True
        model, data, train, tune, _ = _parse_train_args(dict(raw))
    return {"model": model.model_name_or_path, "stage": tune.stage, "finetuning_type": tune.finetuning_type,
            "lora_target": list(tune.lora_target), "quantization_bit": model.quantization_bit,
            "dataset": list(data.dataset or []), "cutoff_len": data.cutoff_len,
            "per_device_train_batch_size": train.per_device_train_batch_size,
            "gradient_accumulation_steps": train.gradient_accumulation_steps}


def parse_torchtune(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from torchtune import config

    cfg = OmegaConf.load(path)
    config._validate.validate(cfg)  # what `tune validate` runs
    model = config.instantiate(cfg.model)
    tokenizer = config.instantiate(cfg.tokenizer)
    dataset = config.instantiate(cfg.dataset, tokenizer)
    return {"model": cfg.model._component_, "params": sum(p.numel() for p in model.parameters()),
            "rows": len(dataset), "batch_size": cfg.batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps}


def parse_litgpt(path: Path) -> dict[str, Any]:
    from jsonargparse import CLI, capture_parser
    from litgpt.__main__ import PARSER_DATA

    command = litgpt_command(path)
    parser = capture_parser(lambda: CLI(PARSER_DATA, args=[]))
    cfg = parser.parse_args([command, "--config", str(path)])
    init = parser.instantiate(cfg) if hasattr(parser, "instantiate") else parser.instantiate_classes(cfg)
    sub = init[command]
    module = __import__(f"litgpt.finetune.{'lora' if command == 'finetune_lora' else 'full'}", fromlist=["x"])
    module.validate_args(sub.train, sub.eval)
    return {"command": command, "data": type(sub.data).__name__, "lora_r": sub.get("lora_r"),
            "micro_batch_size": sub.train.micro_batch_size, "global_batch_size": sub.train.global_batch_size}


PARSERS = {"axolotl": parse_axolotl, "llama-factory": parse_llama_factory, "torchtune": parse_torchtune,
           "litgpt": parse_litgpt}
FILES = {"axolotl": "axolotl.yaml", "llama-factory": "llamafactory.yaml", "torchtune": "torchtune.yaml",
         "litgpt": "litgpt.yaml"}
IMPORTS = {"axolotl": "axolotl.utils.config", "llama-factory": "llamafactory.hparams", "torchtune": "torchtune.config",
           "litgpt": "litgpt.__main__"}


def litgpt_command(path: Path) -> str:
    return "finetune_lora" if "lora_r" in yaml.safe_load(path.read_text()) else "finetune_full"


def short_run_command(tool: str, path: Path, python: str, steps: int = 2, device: str | None = None) -> list[str]:
    """argv that starts `steps` optimizer steps of the exported file (device overrides the file's
    device where the tool takes it on the command line)."""
    bin_dir = Path(python).parent
    if tool == "torchtune":
        recipe = "lora_finetune_single_device" if "lora" in yaml.safe_load(path.read_text())["model"]["_component_"] \
            else "full_finetune_single_device"
        return [str(bin_dir / "tune"), "run", recipe, "--config", str(path), f"max_steps_per_epoch={steps}",
                *([f"device={device}"] if device else [])]
    if tool == "litgpt":
        return [str(bin_dir / "litgpt"), litgpt_command(path), "--config", str(path), "--train.max_steps", str(steps)]
    if tool == "llama-factory":
        return [python, str(Path(__file__).resolve()), "run-llama-factory", str(path), str(steps)]
    # `axolotl train FILE` relaunches itself through `accelerate launch`; its train module is the
    # one-process path that command ends in
    return [python, "-m", "axolotl.cli.train", str(path), f"--max-steps={steps}"]


def run_llama_factory(path: Path, steps: int) -> None:
    """LLaMA-Factory's own training entry (what `llamafactory-cli train FILE max_steps=N` runs).
    Its multimodal plugin imports torchaudio at import time; no torchaudio build exists for the
    pinned torch 2.13 CPU, and nothing here reads audio, so an empty module stands in for it."""
    import importlib.machinery
    import types

    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
    from llamafactory.train.tuner import run_exp

    args = yaml.safe_load(path.read_text())
    run_exp({**args, "max_steps": steps})


if __name__ == "__main__":
    if sys.argv[1] == "parse":
        print(json.dumps(PARSERS[sys.argv[2]](Path(sys.argv[3])), default=str))
    elif sys.argv[1] == "run-llama-factory":
        run_llama_factory(Path(sys.argv[2]), int(sys.argv[3]))
