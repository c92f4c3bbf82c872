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
    from trainfit.config.run_config import RunConfig

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


HOSTFILE = "hostfile"


def hostfile_text(num_nodes: int, slots_per_node: int, header_lines: list[str], command: str) -> str:
    """A DeepSpeed hostfile for `deepspeed --hostfile hostfile`: one `HOST slots=N` line per node.

    The host names are unknown when planning: node-0 .. node-N-1 stand for them and the header says
    to replace them (DeepSpeed's launcher reaches each host by passwordless ssh / pdsh). DeepSpeed's
    parser (deepspeed.launcher.runner._parse_hostfile) skips lines starting with '#', so the header
    can stay. trainfit's launch.sh does not need this file (torchrun / accelerate start each node).
    """
    if num_nodes < 1 or slots_per_node < 1:
        raise ValueError(f"a hostfile needs nodes and slots >= 1, got {num_nodes} x {slots_per_node}")
    lines = [*header_lines,
             "DeepSpeed hostfile: replace node-0 .. node-%d with the nodes' host names (reachable by ssh),"
             % (num_nodes - 1),
             f"then on node-0: {command}"]
    head = "".join(f"# {line}\n" if line else "#\n" for line in lines)
    return head + "".join(f"node-{i} slots={slots_per_node}\n" for i in range(num_nodes))


def deepspeed_json(cfg: RunConfig, header_lines: list[str]) -> str:
    """deepspeed.json text: the config with the header lines under HEADER_KEY, first."""
    import json

    return json.dumps({HEADER_KEY: list(header_lines), **deepspeed_config(cfg)}, indent=2) + "\n"
