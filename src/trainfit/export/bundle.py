"""One configuration as the files the real tools load (trainfit.export.publish.write_tree writes them
all-or-nothing).

`render_files` returns file name -> text (pure: no torch / transformers import):

    run.yaml            the trainfit run config (text given by the caller)
    training_args.yaml  kwargs of TrainingArguments (pretrain), trl.SFTConfig or trl.DPOConfig
    lora.yaml           kwargs of peft.LoraConfig (only when the method trains LoRA adapters)
    accelerate.yaml     the Accelerate config for `accelerate launch --config_file`
    deepspeed.json      the DeepSpeed config (only when DeepSpeed is the engine)
    hostfile            DeepSpeed's hostfile (only DeepSpeed on several nodes)
    launch.sh           the command that starts the run

Several nodes (training.num_nodes > 1 in the run config): the same files serve every node; copy the
folder to each node (or share it) and start `NODE_RANK=R MASTER_ADDR=HOST ./launch.sh` on each
(trainfit.export.launch says why one launch.sh and not one per node). accelerate.yaml carries
num_machines, deepspeed's hostfile one line per node.

Every file starts with the caller's header lines: `# ` comments in YAML and shell; in the JSON
under its "_comment" key (see trainfit.export.deepspeed for why DeepSpeed accepts that key).
Paths inside the files are relative to the folder they are written to: launch.sh changes into
that folder first, and the run directory is runs/<name> there (training_args.yaml's output_dir
is its checkpoints/ subfolder, where `trainfit train` writes checkpoints).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import yaml

from trainfit.errors import BadInputError
from trainfit.export.accelerate_config import accelerate_config
from trainfit.export.deepspeed import HOSTFILE, deepspeed_json, hostfile_text
from trainfit.export.engine import engine
from trainfit.export.launch import launch_command, node_preamble
from trainfit.export.peft_config import lora_config_kwargs, uses_lora
from trainfit.export.training_args import CONFIG_MODULES, trainer_config
from trainfit.versions import transformers_major as installed_transformers_major

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

RUN_FILE = "run.yaml"
TRAINING_ARGS_FILE = "training_args.yaml"
LORA_FILE = "lora.yaml"
ACCELERATE_FILE = "accelerate.yaml"
DEEPSPEED_FILE = "deepspeed.json"
LAUNCH_FILE = "launch.sh"


def run_dir_name(cfg: RunConfig) -> str:
    """runs/<name>: the config's name made safe for a path (the method when it has none)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.name).strip("-.") or cfg.method
    return f"runs/{name}"


def _header_lines(header_lines: list[str], about: list[str]) -> list[str]:
    lines = [part for line in header_lines for part in str(line).splitlines() or [""]]
    return lines + about


def _comments(lines: list[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def yaml_text(data: dict) -> str:
    """A config file's YAML: keys in the order given, block style (every exported YAML file)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


PURE_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def precision_lines(cfg: RunConfig, class_name: str) -> list[str]:
    """What a pure 16-bit precision means in these files: the weights themselves are 16-bit, there is
    no autocast, so TrainingArguments' bf16/fp16 and Accelerate's mixed_precision (both autocast
    switches) stay off; an autocast run would be another run than the one planned."""
    p = cfg.training.precision
    if p not in PURE_DTYPES:
        return []
    where = ("model_init_kwargs.dtype below" if class_name != "TrainingArguments"
             else f"load the model with dtype=torch.{PURE_DTYPES[p]}")
    return [f"precision {p}: the model's weights are {PURE_DTYPES[p]} ({where}; trainfit train loads them so), "
            f"with no autocast: {p}: false and mixed_precision: 'no' are the autocast switches, off on purpose"]


def render_files(cfg: RunConfig, *, header_lines: list[str], num_processes: int, device: str,
                 run_config_text: str, transformers_major: int | None = None, network=None) -> dict[str, str]:
    """File name -> full text for one configuration run as num_processes processes on device.

    device: the resolved device (cpu, cuda, mps). transformers_major: the Transformers major
    version the files are for (FSDP and checkpointing argument forms); default: the installed
    one, or trainfit.versions.TRANSFORMERS_MAJOR_DEFAULT without Transformers.
    network: several nodes: the NetworkSpec between them, whose NCCL / EFA variables launch.sh sets
    (trainfit.core.run.cluster_env; None: plain Ethernet).
    """
    major = installed_transformers_major() if transformers_major is None else transformers_major
    eng = engine(cfg, num_processes=num_processes)
    run_dir = run_dir_name(cfg)
    nodes = max(1, cfg.training.num_nodes)
    if num_processes % nodes:
        raise BadInputError(f"training.num_nodes {nodes}: {num_processes} processes do not split evenly over the nodes",
                            hint="give each node the same number of GPUs")
    per_node = num_processes // nodes
    accel = accelerate_config(cfg, num_processes=num_processes, device=device, transformers_major=major,
                              deepspeed_file=DEEPSPEED_FILE, num_machines=nodes)
    class_name, args = trainer_config(cfg, device=device, output_dir=f"{run_dir}/checkpoints",
                                      world_size=num_processes, transformers_major=major,
                                      deepspeed_file=DEEPSPEED_FILE if eng == "deepspeed" else None)
    qualified = f"{CONFIG_MODULES[class_name]}.{class_name}"
    here = "Paths are relative to this folder (launch.sh runs in it)."
    precision = precision_lines(cfg, class_name)
    if precision and class_name != "TrainingArguments":
        # SFTTrainer / DPOTrainer given a model id load it with these: the base in the plan's 16-bit
        # dtype (trainfit train loads it so itself and passes the model, which TRL then keeps).
        args = {**args, "model_init_kwargs": {"dtype": PURE_DTYPES[cfg.training.precision]}}
    files: dict[str, str] = {}
    files[RUN_FILE] = _comments(_header_lines(header_lines, [
        f"trainfit run config: trainfit train {RUN_FILE} --out {run_dir} (see {LAUNCH_FILE})"])) + run_config_text
    files[TRAINING_ARGS_FILE] = _comments(_header_lines(header_lines, [
        f"Keyword arguments of {qualified}, as trainfit train builds them (not of another config class):",
        f"  from {CONFIG_MODULES[class_name]} import {class_name}; "
        f"{class_name}(**yaml.safe_load(open(\"{TRAINING_ARGS_FILE}\")))", *precision, here])) + yaml_text(args)
    if uses_lora(cfg):
        files[LORA_FILE] = _comments(_header_lines(header_lines, [
            "Keyword arguments of peft.LoraConfig, as trainfit train builds them:",
            f"  LoraConfig(**yaml.safe_load(open(\"{LORA_FILE}\")))"])) + yaml_text(lora_config_kwargs(cfg))
    machines = (f" on {nodes} machines; launch.sh gives each its --machine_rank and node 0's address"
                if nodes > 1 else "")
    files[ACCELERATE_FILE] = _comments(_header_lines(header_lines, [
        f"Accelerate config ({accel['distributed_type']}, {num_processes} process(es){machines}): "
        f"accelerate launch --config_file {ACCELERATE_FILE} ...", *precision, here])) + yaml_text(accel)
    if eng == "deepspeed":
        files[DEEPSPEED_FILE] = deepspeed_json(cfg, _header_lines(header_lines, [
            f"DeepSpeed config; \"auto\" values are filled in by Transformers from {TRAINING_ARGS_FILE}."]))
    if eng == "deepspeed" and nodes > 1:
        files[HOSTFILE] = hostfile_text(nodes, per_node, _header_lines(header_lines, []),
                                        f"deepspeed --hostfile {HOSTFILE} --module trainfit train {RUN_FILE} --out {run_dir}")
    command = launch_command(RUN_FILE, out_dir=run_dir, num_processes=num_processes, strategy=eng,
                             accelerate_file=ACCELERATE_FILE if device == "cuda" else None, num_nodes=nodes)
    about = [f"Starts the run ({eng}, {num_processes} process(es) on {device}); extra arguments go to "
             "trainfit train (e.g. --resume)."]
    if nodes > 1:
        about += [f"{nodes} nodes x {per_node} process(es): run this same file on every node, with this folder "
                  "copied (or shared) there:",
                  "  node 0:  NODE_RANK=0 MASTER_ADDR=<node 0's address> [MASTER_PORT=29500] ./launch.sh",
                  f"  node R:  NODE_RANK=R MASTER_ADDR=<node 0's address> [MASTER_PORT=29500] ./launch.sh  "
                  f"(R = {'1' if nodes == 2 else f'1..{nodes - 1}'})",
                  "  with TRAINFIT_CHECKPOINT_DIR=<a directory every node mounts> on every node: the run directory is "
                  f"$TRAINFIT_CHECKPOINT_DIR/{run_dir} (checkpoints a --resume reads on every node)"]
    files[LAUNCH_FILE] = ("#!/usr/bin/env bash\n" + _comments(_header_lines(header_lines, about)) + "set -euo pipefail\n"
        + 'cd "$(dirname "${BASH_SOURCE[0]}")"  # the files below are named relative to this folder\n'
        + (node_preamble(nodes, network) if nodes > 1 else "")
        + f'{command} "$@"\n')
    return files
