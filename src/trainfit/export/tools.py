"""`plan --for TOOL`: a planned mode written as the native config of the tool the user trains with.

trl (the default) is what `plan --out` writes today: trainfit's run config plus the TRL /
Accelerate / DeepSpeed files. Every other tool adds its own file(s) to the same mode folder, next
to those (so run.yaml, the plan the file came from, and deepspeed.json, which Axolotl and
LLaMA-Factory point to, stay beside it):

    axolotl        axolotl.yaml                            axolotl train axolotl.yaml
    llama-factory  llamafactory.yaml, dataset_info.json    llamafactory-cli train llamafactory.yaml
    torchtune      torchtune.yaml                          tune run <recipe> --config torchtune.yaml
    litgpt         litgpt.yaml (+ litgpt_data.json)        litgpt finetune_lora --config litgpt.yaml

Each writer (trainfit.export.axolotl, .llama_factory, .torchtune, .litgpt_config) maps the parsed
run config (method, precision, batch split, sequence length, checkpointing, sharding, LoRA,
quantisation, optimizer, schedule, data, output) onto the tool's own keys and returns
(file name -> text, the defaults this tool would choose differently); the header of each file
states the plan it came from and those defaults. A method the tool lacks is refused (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING


from trainfit.errors import BadInputError

if TYPE_CHECKING:
    from trainfit.core.models.spec import ModelSpec
    from trainfit.config.run_config import RunConfig

TOOLS = ("trl", "axolotl", "llama-factory", "torchtune", "litgpt")
DEFAULT_TOOL = "trl"
# The methods each tool's writer maps (pretraining plans stay trainfit's own: a shape with random
# weights is not a checkpoint these tools load). trl, the default, writes trainfit's own files, for
# every method the planner plans.
TOOL_METHODS = {
    "axolotl": ("full", "lora", "qlora", "dpo"),
    "llama-factory": ("full", "lora", "qlora", "dpo"),
    "torchtune": ("full", "lora", "qlora"),
    "litgpt": ("full", "lora", "qlora"),
}
WHY_NOT = {
    ("torchtune", "dpo"): "torchtune's DPO recipes read chosen/rejected conversations, not the plan's "
                          "prompt/chosen/rejected rows; plan --for trl, axolotl or llama-factory for DPO",
    ("litgpt", "dpo"): "LitGPT has no preference-tuning (DPO) recipe; plan --for trl, axolotl or llama-factory",
}
# trainfit optimizer -> the `optim` name of Transformers' TrainingArguments (Axolotl, LLaMA-Factory).
HF_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit",
            "paged-adamw-32bit": "paged_adamw_32bit", "sgd": "sgd", "sgd-momentum": "sgd",
            "adafactor": "adafactor", "lion": "lion_32bit"}


@dataclass(frozen=True)
class ToolPlan:
    """What a writer maps: the mode's validated run config, the model's shapes, where the mode's
    files go (absolute; the tools resolve paths from where they are started), and the header."""

    cfg: RunConfig
    spec: ModelSpec
    folder: Path
    header_lines: list[str]
    deepspeed_file: str | None = None  # deepspeed.json beside it, when the plan shards with DeepSpeed
    notes: list[str] = field(default_factory=list)


def check_tool(tool: str | None, flag: str = "--for") -> str:
    name = (tool or DEFAULT_TOOL).strip().lower().replace("_", "-")
    name = {"llamafactory": "llama-factory", "hf": "trl", "transformers": "trl"}.get(name, name)
    if name not in TOOLS:
        raise BadInputError(f"{flag}: {tool!r} is not one of {', '.join(TOOLS)}")
    return name


def check_method(tool: str, method: str, flag: str = "--for") -> None:
    """Exit 2 when the tool has no recipe for the plan's method (said before anything is written)."""
    if tool == DEFAULT_TOOL or method in TOOL_METHODS[tool]:
        return
    why = WHY_NOT.get((tool, method)) or (
        f"{tool} configs are written for fine-tuning a checkpoint; a pretraining plan (a shape with random "
        "weights) is written for trainfit's own run (--for trl)" if method == "pretrain" else "not mapped")
    raise BadInputError(f"{flag} {tool}: method {method} is not available ({why})",
                        hint=f"valid methods for {tool}: {', '.join(TOOL_METHODS[tool])}")


def header(plan: ToolPlan, tool: str, differs: list[str]) -> str:
    lines = [*plan.header_lines, f"{tool} config written from this plan (run.yaml beside it is the same plan for "
             "trainfit train); paths are absolute."]
    lines += plan.notes
    if differs:
        lines.append(f"Where {tool}'s own defaults differ (this file sets the plan's value):")
        lines += [f"  - {d}" for d in differs]
    return "".join(f"# {line}\n" if line else "#\n" for part in lines for line in str(part).splitlines() or [""])



# ---- what every writer reads from the run config -------------------------------------------------

def model_path(cfg: RunConfig) -> str:
    """The checkpoint the tool loads: the local directory, else the Hub id."""
    if cfg.model.path:
        return str(Path(cfg.model.path).expanduser().resolve())
    if cfg.model.id:
        return cfg.model.id
    raise BadInputError("--for: the plan's model is a shape with random weights; give a Hub id or a local "
                        "checkpoint directory")


def data_files(cfg: RunConfig) -> list[str]:
    """The plan's data as absolute paths (a shipped sample set as the file inside the package)."""
    from trainfit.config.run_config import resolve_data_path

    return [str(Path(resolve_data_path(p)).expanduser().resolve()) for p in cfg.data.paths]


def data_format(cfg: RunConfig) -> str:
    """text, chat or preference: the run config's, else the method's and the sample set's."""
    if cfg.data.format:
        return cfg.data.format
    if cfg.method == "dpo":
        return "preference"
    return "chat" if any(p == "builtin:tiny-chat" for p in cfg.data.paths) else "text"


def lora_targets(cfg: RunConfig) -> list[str] | str:
    """PEFT's target names for the plan's adapters (export.peft_config.lora_kwargs: "all-linear" or a list)."""
    from trainfit.export.peft_config import lora_config_kwargs

    return lora_config_kwargs(cfg)["target_modules"]


def run_dir(plan: ToolPlan, tool: str) -> str:
    """Where the tool writes checkpoints: runs/<tool>-<name> in the mode's folder."""
    from trainfit.export.bundle import run_dir_name

    return str(plan.folder / f"{run_dir_name(plan.cfg)}-{tool}")


def precision_flags(cfg: RunConfig) -> tuple[bool, bool]:
    """(bf16, fp16) for Trainer-based tools: both autocast-and-16-bit-weights switches there."""
    p = cfg.training.precision
    return p in ("bf16", "bf16-mixed"), p in ("fp16", "fp16-mixed")


def steps_or_epochs(cfg: RunConfig) -> tuple[int | None, float | None]:
    s = cfg.schedule
    return (s.max_steps, None) if s.max_steps else (None, s.epochs or 1.0)


def uses_fsdp(cfg: RunConfig) -> bool:
    return cfg.distributed.strategy == "fsdp" or cfg.training.fsdp_strategy != "none"
