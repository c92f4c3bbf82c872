"""The DeepSpeed config (deepspeed.json) for a run config.

Every value that TrainingArguments also owns is "auto": micro batch, accumulation, global batch,
gradient clipping and bf16/fp16 enablement. Transformers fills them in from the arguments
(HfTrainerDeepSpeedConfig.trainer_config_process), so the two can never disagree. The optimizer
and LR scheduler are not set: the Trainer builds them from `optim` / `lr_scheduler_type` exactly
as without DeepSpeed. ZeRO stage and offload come from training.zero_stage / training.offload.

JSON header: JSON has no comments. DeepSpeed's parser (deepspeed.runtime.config.DeepSpeedConfig)
reads only the top-level keys it knows and ignores others (its sections, e.g.
`zero_optimization`, are strict pydantic models that reject unknown keys); Transformers and
Accelerate pass the dict through. So the header goes into one extra top-level key,
HEADER_KEY, a list of lines; tests/export checks that DeepSpeed accepts the file with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainfit.train.run_config import RunConfig

HEADER_KEY = "_comment"
AUTO = "auto"
# The keys whose value TrainingArguments owns (dotted paths into the config).
AUTO_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
             "gradient_clipping", "bf16.enabled", "fp16.enabled")


def deepspeed_config(cfg: RunConfig) -> dict[str, Any]:
    """DeepSpeed config dict; "auto" values are filled in by Transformers from the arguments."""
    t = cfg.training
    zero: dict[str, Any] = {"stage": t.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if t.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if t.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": AUTO, "gradient_accumulation_steps": AUTO,
            "train_batch_size": AUTO, "gradient_clipping": AUTO, "zero_optimization": zero,
            "bf16": {"enabled": AUTO}, "fp16": {"enabled": AUTO}}


def deepspeed_json(cfg: RunConfig, header_lines: list[str]) -> str:
    """deepspeed.json text: the config with the header lines under HEADER_KEY, first."""
    import json

    return json.dumps({HEADER_KEY: list(header_lines), **deepspeed_config(cfg)}, indent=2) + "\n"
