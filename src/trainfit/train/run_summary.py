"""What a run reports: the plan of an attempt (the run_plan event), the losses it logged, and
summary.json (measured against predicted)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from trainfit.config.run_config import RunConfig


def median_after_warmup(values: list[float], warmup: int = 2) -> float | None:
    tail = values[warmup:] if len(values) > warmup else values
    return statistics.median(tail) if tail else None


def logged_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of the logged steps in metrics.jsonl (the last record of a step counts)."""
    out: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "event" not in rec and "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return sorted(out.items())


def plan_details(built, cfg: RunConfig, device: str, world_size: int, stop_after: int | None) -> dict[str, Any]:
    """What an attempt is planned to do (the run_plan event; the dashboard draws its memory curve
    against the predicted total). A prediction that fails never stops a run: its reason is kept."""
    from trainfit.train.predictions import predict

    try:
        pred = predict(built.spec, cfg.to_setup(device, num_gpus=world_size if device == "cuda" else 1),
                       built.spec_note)
        predicted = {"tensor_peak_bytes": pred.tensor_peak_bytes, "total_bytes": pred.total_bytes,
                     "step_seconds": pred.step_seconds, "unavailable": pred.unavailable}
    except Exception as exc:  # noqa: BLE001 - the summary reports why, when it predicts again
        predicted = {"unavailable": {"total_bytes": f"{type(exc).__name__}: {exc}"}}
    t = cfg.training
    return {"method": cfg.method, "model": built.spec.id if built.spec else cfg.model.path, "device": device,
            "processes": world_size, "stop_step": stop_after, "predicted": predicted,
            "training": {"micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
                         "grad_checkpointing": t.grad_checkpointing, "precision": t.precision},
            "global_batch": t.micro_batch * t.grad_accum * world_size}


def build_summary(cfg, built, trainer, timer, writer, device, world_size, wall, resume_from, tok_note,
                  memory, session=None, config_changes=()) -> dict[str, Any]:
    from trainfit.train.predictions import predict

    model = trainer.model
    measured_step = median_after_warmup(timer.step_seconds)
    pred = predict(built.spec, cfg.to_setup(device, num_gpus=world_size if device == "cuda" else 1),
                   built.spec_note)
    measured_peak = memory.get("cuda_max_allocated_bytes", memory["peak_rss_bytes"])
    records = writer.records
    return {
        "method": cfg.method, "name": cfg.name, "model": built.spec.id if built.spec else cfg.model.path,
        "weights": built.weights, "tokenizer": tok_note, "device": device, "processes": world_size,
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "global_batch": cfg.training.micro_batch * cfg.training.grad_accum * world_size,
        # how a step was computed at the end (a recovery may have split the micro-batch or changed the
        # precision; RUN_DIR/adjustments.json) and what recovered
        "training": {"micro_batch": cfg.training.micro_batch, "grad_accum": cfg.training.grad_accum,
                     "grad_checkpointing": cfg.training.grad_checkpointing, "precision": cfg.training.precision},
        "recoveries": list(session.adj.history) if session is not None else [],
        # how this invocation's config in force came from config.yaml (train/in_force.py)
        "config_changes": [{k: v for k, v in c.as_event().items() if k not in ("event", "time")}
                           for c in config_changes],
        "global_step": trainer.state.global_step, "max_steps": trainer.state.max_steps,
        "resumed_from": resume_from.path.name if resume_from else None,
        "first_loss": records[0]["loss"] if records else None, "final_loss": records[-1]["loss"] if records else None,
        "wall_seconds": wall,
        "measured": {"step_seconds_median": measured_step, "steps_timed": len(timer.step_seconds),
                     "peak_bytes": measured_peak,
                     "peak_kind": "cuda_max_allocated" if "cuda_max_allocated_bytes" in memory else "peak_rss",
                     **memory,
                     "tokens_per_second_median": statistics.median([r["tokens_per_second"] for r in records])
                     if records else None},
        "predicted": {"tensor_peak_bytes": pred.tensor_peak_bytes, "total_bytes": pred.total_bytes,
                      "step_seconds": pred.step_seconds, "unavailable": pred.unavailable},
        "ratios": {
            "peak_memory_measured_over_predicted_total": (measured_peak / pred.total_bytes
                                                          if pred.total_bytes else None),
            "step_seconds_measured_over_predicted": (measured_step / pred.step_seconds
                                                     if measured_step and pred.step_seconds else None),
        },
    }
