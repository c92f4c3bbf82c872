"""A planned mode as a trainfit run config, and every file the real tools load for it.

The run config is what `trainfit train` consumes; the other files (trainfit.export.bundle)
are rendered from that same config, so the exported TrainingArguments / DeepSpeed / Accelerate
files are exactly what `trainfit train` runs.

Decisions where a plan says nothing: the data is the user's --data, else the shipped sample set
for the method (the header says to plan with --data for one's own); learning rates are the common defaults per
method (pretraining 6e-4 for small models, full fine-tuning 2e-5, LoRA 2e-4, DPO 1e-6 full /
5e-6 LoRA), with 3 % warm-up and cosine decay; checkpoints every ~30 minutes of predicted time
(conservative 15, extreme 60), at least every 1,000 steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from trainfit import __version__
from trainfit.core.plan.planner import ModePlan, PlanRequest
from trainfit.core.setup import SFT_METHODS

if TYPE_CHECKING:
    from trainfit.export.cluster_job import ClusterJob
    from trainfit.export.tools import ToolPlan

LEARNING_RATES = {"pretrain": 6e-4, "full": 2e-5, "lora": 2e-4, "qlora": 2e-4, "dpo": 1e-6, "dpo+lora": 5e-6}
SAMPLE_DATA = {"pretrain": "builtin:tiny-corpus", "full": "builtin:tiny-chat", "lora": "builtin:tiny-chat",
               "qlora": "builtin:tiny-chat", "dpo": "builtin:tiny-preferences"}
CHECKPOINT_MINUTES = {"conservative": 15.0, "balanced": 30.0, "extreme": 60.0}


def _model_section(mp: ModePlan) -> tuple[dict[str, Any], int | None]:
    """The run config's model: a shape for pretraining, a Hub id, or a local directory."""
    spec = mp.model
    assert spec is not None
    if mp.pretrain is not None or spec.source == "shape":
        shape = {"layers": spec.num_layers, "hidden": spec.hidden_size, "heads": spec.num_heads,
                 "kv_heads": spec.num_kv_heads, "intermediate": spec.intermediate_size,
                 "max_position_embeddings": spec.max_position_embeddings, "tie_embeddings": spec.tie_embeddings}
        return {"shape": shape, "weights": "random"}, spec.vocab_size
    if spec.id.startswith("local:"):
        return {"path": spec.id[len("local:"):], "weights": "local"}, None
    return {"id": spec.id, "weights": "hub"}, None


def run_config_dict(mp: ModePlan, req: PlanRequest, data_paths: list[str] | None = None) -> dict[str, Any]:
    s = mp.setup
    assert s is not None and mp.speed is not None
    model, vocab = _model_section(mp)
    method = s.method
    lr_key = "dpo+lora" if method == "dpo" and s.lora is not None else method
    training: dict[str, Any] = {
        "precision": s.precision, "optimizer": s.optimizer, "micro_batch": s.micro_batch,
        "grad_accum": s.grad_accum, "seq_len": s.seq_len, "grad_checkpointing": s.grad_checkpointing,
        "attention": s.attention, "zero_stage": s.zero_stage, "offload": s.offload, "num_gpus": s.num_gpus,
        **({"num_nodes": s.num_nodes, "hybrid_shard": s.hybrid_shard} if s.num_nodes > 1 else {}),
        "device": "cpu" if s.device == "cpu" else "cuda" if s.device in ("cuda", "rocm") else s.device,
    }
    if s.lora is not None:
        training["lora"] = {"rank": s.lora.rank, "alpha": s.lora.alpha, "dropout": s.lora.dropout,
                            "target_modules": s.lora.target_modules}
    if s.quant != "none":
        training["quant"] = s.quant
    if method == "dpo":
        training["dpo_reference"] = s.dpo_reference
    steps = mp.run.steps if mp.run is not None else None
    budget = mp.data_io.budget if mp.data_io is not None else None
    if budget is not None and budget.capped_by and budget.steps:
        steps = budget.steps  # the mode's hours / the --budget dollars cut the run (data_io's token budget)
    schedule: dict[str, Any] = {"lr": LEARNING_RATES[lr_key], "scheduler": "cosine"}
    if steps:
        schedule["max_steps"] = int(steps)
        schedule["warmup_steps"] = max(1, int(0.03 * steps))
    else:
        schedule["epochs"] = req.epochs
        schedule["warmup_steps"] = 10
    per_ckpt = CHECKPOINT_MINUTES.get(mp.mode, 30.0) * 60
    every = max(1, min(1000, int(per_ckpt / max(mp.speed.step_seconds, 1e-6))))
    if steps:
        every = min(every, max(1, steps))
    cfg: dict[str, Any] = {"version": 1, "name": f"{mp.mode}", "method": method, "model": model}
    if vocab is not None:
        cfg["tokenizer"] = {"vocab_size": int(vocab)}
    data = data_paths or [SAMPLE_DATA[method]]
    cfg["data"] = {"paths": data, **_data_format(method, mp), **data_keys(mp, steps)}
    cfg["training"] = training
    cfg["schedule"] = schedule
    cfg["checkpointing"] = {"every_steps": every, "keep_last": 2}
    if getattr(req, "spot", None) is not None:  # plan --flavor ID --spot
        cfg["safety"], cfg["checkpointing"]["every_steps"] = spot_safety(mp, req, every)
    if s.zero_stage:
        # hybrid sharding is FSDP's (HYBRID_SHARD / HSDP): DeepSpeed's ZeRO shards over every rank
        cfg["distributed"] = {"strategy": "fsdp" if s.hybrid_shard else "deepspeed"}
    return cfg


def _data_format(method: str, mp: ModePlan) -> dict[str, str]:
    """data.format for fine-tuning on the user's JSON rows: chat when they hold `messages` (the run
    config's default for SFT is text). Pretraining reads text and DPO preference pairs by default."""
    cols = mp.data_io.columns if mp.data_io is not None else ()
    if method in SFT_METHODS and "messages" in cols:
        return {"format": "chat"}
    return {}


def spot_safety(mp: ModePlan, req: PlanRequest, every: int) -> tuple[dict[str, Any], int]:
    """A spot flavor's run config: its interruption figure for the trainer's cadence policy (with
    the mode whose thresholds the plan priced), and every_steps no longer than the planned interval
    (so training_args.yaml's save_steps suits the machine when run without trainfit too)."""
    figure = req.spot.interruption  # type: ignore[union-attr]
    safety = {"mode": mp.mode, "interruption_hours": round(figure.mean_hours, 4)}
    est = mp.run.spot if mp.run is not None else None
    if est is not None and mp.speed is not None and mp.speed.step_seconds > 0:
        every = max(1, min(every, int(est.checkpoint_interval_seconds / mp.speed.step_seconds)))
    return safety, every


def data_keys(mp: ModePlan, steps: int | None) -> dict[str, Any]:
    """The data plan's decisions as `data:` keys of the run config (`trainfit train` honours them)."""
    dp = mp.data_io
    if dp is None:
        return {}
    # A stream has no length: the run config can stream only when the plan knows the run's steps.
    return {"streaming": bool(dp.streaming and steps), "cache_dir": dp.cache_dir,
            "keep_in_memory": dp.keep_in_memory, "num_workers": dp.num_workers,
            "prefetch_factor": dp.prefetch_factor, "packing": dp.packing}


def header_lines(mp: ModePlan, command: str) -> list[str]:
    s, sp, run = mp.setup, mp.speed, mp.run
    assert s is not None and sp is not None and mp.memory_used_bytes is not None
    from trainfit.core.durations import duration_text, hours_text

    gib = 1 << 30
    lines = [f"trainfit {__version__} plan, mode {mp.mode}: {mp.model_id} ({s.method}) on {s.num_gpus} x {s.device}",
             f"reproduce: {command}",
             f"estimate: {mp.memory_used_bytes / gib:.2f} GiB per device of this mode's "
             f"{(mp.memory_budget_bytes or 0) / gib:.2f} GiB budget; {duration_text(sp.step_seconds)} per optimizer step, "
             f"{sp.tokens_per_second:,.0f} tokens/s"]
    if run is not None and run.hours is not None:
        lines.append(f"run: {run.steps:,} steps, {hours_text(run.hours)}, {run.energy_kwh or 0:.2f} kWh"
                     + (f", rental ${run.rental_usd:.2f}" if run.rental_usd is not None else ""))
    dp = mp.data_io
    if dp is not None:
        lines.append(f"data: {dp.dataset}: {dp.reasons.get('source', '')}; cache: {dp.reasons.get('cache', '')}")
        if dp.budget is not None and dp.budget.capped_by:
            lines.append(f"max_steps {dp.budget.steps:,}: {dp.reasons.get('budget', '')}")
        if dp.source == "hub":
            lines.append(f"data.paths: trainfit train reads local data; save {dp.dataset} with datasets' "
                         "save_to_disk and plan with --data DIR")
    return lines


def plan_files(mp: ModePlan, req: PlanRequest, command: str, data_paths: list[str] | None = None,
               base_dir=None, launchers: tuple[str, ...] = (), tool: str = "trl") -> dict[str, str]:
    """File name -> text for one mode (run.yaml, training_args.yaml, lora.yaml, accelerate.yaml,
    deepspeed.json, launch.sh, each of `launchers`' specs: trainfit.export.cluster_job, and with tool
    the config of that tool: trainfit.export.tools): the run config is validated by the run-config
    parser first."""
    from pathlib import Path

    from trainfit.export.bundle import render_files
    from trainfit.config.run_config import parse_run_config

    raw = run_config_dict(mp, req, data_paths)
    cfg = parse_run_config(raw, base_dir=Path(base_dir or "."), source=f"plan {mp.mode}")
    lines = header_lines(mp, command)
    est = mp.run.spot if mp.run is not None else None
    if est is not None:
        from trainfit.core.cloud.spot import hours_text

        lines.append(f"spot: {hours_text(est.interruption_hours)} between interruptions ({est.interruption_id}); "
                     f"checkpoint every {est.checkpoint_interval_seconds / 60:.1f} min; expected cost incl. re-done "
                     f"work ${mp.run.rental_expected_usd or 0:.2f} (uninterrupted ${mp.run.rental_usd or 0:.2f})")
    if not data_paths:
        lines.append(f"data: {raw['data']['paths'][0]} is a shipped sample set; plan with --data to use yours")
    if mp.pretrain is not None:
        lines.append(f"model sized for a {raw['tokenizer']['vocab_size']}-token vocabulary: a tokenizer trained on a "
                     "small corpus can stop short of it, which shrinks the embeddings (summary.json then predicts "
                     "the model that ran)")
    s = mp.setup
    assert s is not None
    device = "cuda" if s.device in ("cuda", "rocm") else s.device
    text = yaml.safe_dump(raw, sort_keys=False)
    from trainfit.core.machines.network_catalog import get_network

    hw = req.hardware
    network = get_network(hw.nodes.network) if hw.node_count > 1 and hw.nodes.network else None
    if network is not None:
        from trainfit.core.run.cluster_env import env_text

        lines.append(f"cluster: {env_text(network)} (launch.sh sets them; checkpoints on shared storage: "
                     "TRAINFIT_CHECKPOINT_DIR)")
    files = render_files(cfg, header_lines=lines, num_processes=max(1, s.num_gpus) if device != "cpu" else 1,
                         device=device, run_config_text=text, network=network)
    if launchers:
        from trainfit.export.bundle import run_dir_name
        from trainfit.export.cluster_job import cluster_job

        job = cluster_job(mp, req, run_dir=run_dir_name(cfg), keep_last=cfg.checkpointing.keep_last,
                          header_lines=lines, plan_files=files)
        files.update(launcher_files(job, launchers))
    if tool != "trl":
        from trainfit.export.tools import ToolPlan

        ds = "deepspeed.json" if "deepspeed.json" in files else None
        files.update(tool_files(tool, ToolPlan(cfg=cfg, spec=mp.model, folder=Path(base_dir or ".").resolve(),
                                               header_lines=lines, deepspeed_file=ds)))
    return files


# The two dispatchers sit here, above the writers they pick: each writer reads the shared parts
# (export/cluster_job.py, export/tools.py), so a dispatcher there would make an import circle.
def launcher_files(job: ClusterJob, launchers: list[str] | tuple[str, ...]) -> dict[str, str]:
    """File name -> text of each asked-for engine's spec."""
    from trainfit.export.cluster_job import LAUNCHERS

    files: dict[str, str] = {}
    for launcher in dict.fromkeys(launchers):
        if launcher == "slurm":
            from trainfit.export.slurm import SBATCH_FILE, sbatch_script

            files[SBATCH_FILE] = sbatch_script(job)
        elif launcher == "skypilot":
            from trainfit.export.skypilot import skypilot_files

            files.update(skypilot_files(job))
        elif launcher == "kubernetes":
            from trainfit.export.kubernetes import MANIFEST_FILE, pytorchjob_manifest

            files[MANIFEST_FILE] = pytorchjob_manifest(job)
        else:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    return files


def tool_files(tool: str, plan: ToolPlan) -> dict[str, str]:
    """File name -> text of the tool's config(s) for one mode (empty for trl: today's files)."""
    if tool == "trl":
        return {}
    from trainfit.export.tools import check_method, header

    check_method(tool, plan.cfg.method)
    from trainfit.export import axolotl, litgpt_config, llama_factory, torchtune

    writer = {"axolotl": axolotl.files, "llama-factory": llama_factory.files, "torchtune": torchtune.files,
              "litgpt": litgpt_config.files}[tool]
    files, differs = writer(plan)
    head = header(plan, tool, differs)
    return {name: (head + text if name.endswith((".yaml", ".yml")) else text) for name, text in files.items()}
