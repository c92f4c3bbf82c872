"""A planned pipeline mode as files: one meta-config (pipeline.yaml, docs/pipeline.md) that
`trainfit train` runs phase by phase, and each phase's own files (run.yaml, training_args.yaml,
...) from the single-run writers in a subfolder named after the phase.

The meta-config holds every phase as a complete run config (the run.yaml schema, validated by
the run-config parser here, before anything is written), the hand-off (start_from, adapters) and
an `estimate:` section that `trainfit train` does not read: per phase and in total, what the plan
predicted.
"""

from __future__ import annotations

from typing import Any

import yaml

from trainfit import __version__
from trainfit.config.pipeline import PIPELINE_CONFIG_VERSION
from trainfit.core.plan.pipeline import PhasePlan, PipelineMode, PipelinePlan
from trainfit.core.serde import to_jsonable

META_FILE = "pipeline.yaml"
GIB = 1 << 30


def phase_run_config(phase: PhasePlan, data: dict[str, list[str]] | None) -> dict[str, Any]:
    """The phase's run config (the single-run exporter's), named after the phase."""
    from trainfit.export.plan_files import run_config_dict

    raw = run_config_dict(phase.plan, phase.request, (data or {}).get(phase.name))
    raw["name"] = f"{phase.plan.mode}-{phase.name}"
    return raw


def phase_estimate(phase: PhasePlan) -> dict[str, Any]:
    mp, run = phase.plan, phase.plan.run
    s = mp.setup
    assert s is not None and mp.speed is not None
    out: dict[str, Any] = {
        "method": s.method, "lora": s.lora is not None, "precision": s.precision,
        "micro_batch": s.micro_batch, "grad_accum": s.grad_accum, "num_gpus": s.num_gpus, "seq_len": s.seq_len,
        "memory_bytes": mp.memory_used_bytes, "memory_budget_bytes": int(mp.memory_budget_bytes or 0),
        "step_seconds": mp.speed.step_seconds, "tokens_per_second": mp.speed.tokens_per_second,
        "tokens": run.tokens if run else None, "steps": run.steps if run else None,
        "hours": run.hours if run else None, "energy_kwh": run.energy_kwh if run else None,
        "electricity_cost": run.electricity_cost if run else None, "rental_usd": run.rental_usd if run else None,
        "token_basis": phase.token_basis,
    }
    if phase.uncapped is not None:
        out["uncapped"] = {"steps": phase.uncapped.steps, "tokens": phase.uncapped.tokens,
                           "hours": phase.uncapped.hours}
    if phase.reference is not None:
        out["reference"] = phase.reference
        out["reference_bytes"] = phase.reference_bytes
    return out


def meta_config_dict(pm: PipelineMode, pipeline: str, data: dict[str, list[str]] | None = None) -> dict[str, Any]:
    phases = []
    for ph in pm.phases:
        entry: dict[str, Any] = {"name": ph.name}
        if ph.start_from is not None:
            entry["start_from"] = ph.start_from
        if ph.adapters is not None:
            entry["adapters"] = ph.adapters
        entry["run"] = phase_run_config(ph, data)
        phases.append(entry)
    totals = to_jsonable(pm.totals)
    estimate = {"phases": {ph.name: phase_estimate(ph) for ph in pm.phases}, "totals": totals,
                "hours_max": pm.hours_max, "capped_share": pm.capped_share}
    return {"version": PIPELINE_CONFIG_VERSION, "pipeline": pipeline, "name": pm.mode, "phases": phases,
            "estimate": estimate}


def header_lines(pm: PipelineMode, plan: PipelinePlan, command: str) -> list[str]:
    t = pm.totals
    lines = [f"trainfit {__version__} plan, pipeline {plan.pipeline}, mode {pm.mode}: {plan.model_id} on "
             f"{plan.hardware} ({plan.device})",
             f"reproduce: {command}"]
    for ph in pm.phases:
        mp, run = ph.plan, ph.plan.run
        s = mp.setup
        assert s is not None and mp.speed is not None and mp.memory_used_bytes is not None
        line = (f"phase {ph.name}: {s.method}{' + LoRA' if s.lora is not None and s.method == 'dpo' else ''}, "
                f"{mp.memory_used_bytes / GIB:.2f} GiB per device of {(mp.memory_budget_bytes or 0) / GIB:.2f} GiB, "
                f"{mp.speed.step_seconds:.3g} s/step")
        if run is not None and run.hours is not None:
            line += f", {run.steps:,} steps, {run.hours:.2f} h"
        lines.append(line)
    if t.hours is not None:
        cost = f", ${t.rental_usd:,.2f} rental" if t.rental_usd is not None else ""
        lines.append(f"estimate: {t.hours:.2f} h, {t.energy_kwh or 0:.2f} kWh, electricity "
                     f"{t.electricity_cost or 0:.2f}{cost} for all phases")
    if pm.capped_share is not None:
        lines.append(f"capped: the phases together are over this mode's {pm.hours_max:g} h; each trains "
                     f"{pm.capped_share:.0%} of its data")
    return lines


def meta_config_text(pm: PipelineMode, plan: PipelinePlan, command: str,
                     data: dict[str, list[str]] | None = None, base_dir=None) -> str:
    """The meta-config with its header, checked by the pipeline parser (every phase's run config
    through parse_run_config) before it is returned."""
    from pathlib import Path

    from trainfit.config.pipeline import parse_pipeline

    raw = meta_config_dict(pm, plan.pipeline, data)
    parse_pipeline(raw, base_dir=Path(base_dir or "."), source=f"plan {pm.mode} pipeline")
    lines = header_lines(pm, plan, command)
    if not data:
        lines.append("data: each phase uses a shipped sample set; plan with --data PHASE=PATH to use yours")
    lines.append(f"trainfit pipeline config: trainfit train {META_FILE} --out runs/{pm.mode} [--resume] "
                 "(docs/pipeline.md); `estimate:` is what the plan predicted and is not read by trainfit train")
    return "".join(f"# {line}\n" for line in lines) + yaml.safe_dump(raw, sort_keys=False)


def phase_files(ph: PhasePlan, command: str, data: dict[str, list[str]] | None, base_dir) -> dict[str, str]:
    """The phase's single-run files, each with a line saying what running it alone means."""
    from trainfit.export.plan_files import plan_files

    files = plan_files(ph.plan, ph.request, command, (data or {}).get(ph.name), base_dir=base_dir)
    note = (f"phase {ph.name} of a pipeline: `trainfit train ../{META_FILE}` runs it"
            + (f" from phase {ph.start_from}'s output; run alone, this file starts from the base model"
               if ph.start_from else ""))
    out = {}
    for name, text in files.items():
        if name.endswith(".json"):
            out[name] = text  # DeepSpeed JSON: its header is the _comment key the single-run writer fills
        elif text.startswith("#!"):
            first, rest = text.split("\n", 1)
            out[name] = f"{first}\n# {note}\n{rest}"
        else:
            out[name] = f"# {note}\n{text}"
    return out


def pipeline_files(pm: PipelineMode, plan: PipelinePlan, command: str, data: dict[str, list[str]] | None,
                   base_dir) -> dict[str, dict[str, str]]:
    """Folder (relative to the mode's folder: '' for the meta-config, the phase name for its
    files) -> file name -> text."""
    from pathlib import Path

    base = Path(base_dir)
    out: dict[str, dict[str, str]] = {"": {META_FILE: meta_config_text(pm, plan, command, data, base)}}
    for ph in pm.phases:
        out[ph.name] = phase_files(ph, command, data, base / ph.name)
    return out
