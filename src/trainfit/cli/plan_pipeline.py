"""`trainfit plan MODEL --pipeline sft+dpo ...`: every phase planned per mode, the totals, and with
--out per mode one meta-config (pipeline.yaml) plus each phase's files (docs/pipeline.md)."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError

GIB = 1 << 30


def build_pipeline_request(args: argparse.Namespace):
    from trainfit.cli.plan_request import build_request
    from trainfit.core.plan.pipeline import PIPELINES, PipelineRequest
    from trainfit.core.setup import METHOD_ALIASES

    if args.pipeline not in PIPELINES:
        raise BadInputError(f"--pipeline: {args.pipeline!r} is not one of {', '.join(PIPELINES)}")
    data = phase_data(args.data, PIPELINES[args.pipeline])
    if getattr(args, "dataset", None) is not None:
        raise BadInputError("--dataset: a pipeline's phases each have their own data; give it with --data PHASE=PATH "
                            "(a Hub dataset saved with datasets' save_to_disk)")
    single = copy.copy(args)
    single.data, single.method = None, "auto"  # each phase's method is the pipeline's; data is per phase
    if PIPELINES[args.pipeline][0] == "pretrain":
        single.method = "pretrain"
    base = build_request(single)
    names = PIPELINES[args.pipeline]
    examples = args.examples if "sft" in names else None
    req = PipelineRequest(args.pipeline, base, sft_method=METHOD_ALIASES.get(args.method, args.method),
                          examples=examples, pairs=args.pairs,
                          pretrain_tokens=args.dataset_tokens if "pretrain" in names else None)
    return req, data


def phase_data(values: list[str] | None, phases: tuple[str, ...]) -> dict[str, list[str]] | None:
    """--data PHASE=PATH (repeatable) -> phase -> paths; each path checked like plan's --data."""
    from trainfit.cli.plan_request import data_paths

    if not values:
        return None
    out: dict[str, list[str]] = {}
    for v in values:
        phase, sep, path = v.partition("=")
        if not sep or phase not in phases:
            raise BadInputError(f"--data: {v!r}: a pipeline takes --data PHASE=PATH, PHASE one of "
                                f"{', '.join(phases)} (e.g. --data sft=chat.jsonl --data dpo=pairs.jsonl)")
        out.setdefault(phase, []).extend(data_paths([path]) or [])
    return out


def write_pipeline_exports(pp, out_dir: Path, *, force: bool, data, command: str) -> dict[str, list[str]]:
    """Render every mode's meta-config and phase files first (all validated), then publish them
    all in one step (trainfit.export.publish.write_tree); returns mode -> paths."""
    from trainfit.export.pipeline_files import pipeline_files
    from trainfit.export.publish import write_tree

    rendered = {pm.mode: pipeline_files(pm, pp, command, data, out_dir / pm.mode) for pm in pp.modes
                if pm.fits}
    folders = {str(Path(mode, sub)) if sub else mode: files
               for mode, subs in rendered.items() for sub, files in subs.items()}
    written: dict[str, list[str]] = {}
    for folder, paths in write_tree(out_dir, folders, force=force).items():
        written.setdefault(Path(folder).parts[0], []).extend(str(p) for p in paths)
    return written


def pipeline_document(pp, files: dict[str, list[str]] | None = None) -> dict:
    """The pipeline plan as JSON: per mode the phases (each the Plan JSON of its mode, with the
    hand-off, reference and token budget) and the totals."""
    from trainfit.cli.plan_document import plan_document
    from trainfit.core.plan.planner import Plan
    from trainfit.core.serde import to_jsonable

    modes = []
    for pm in pp.modes:
        phases = []
        for ph in pm.phases:
            one = plan_document(Plan(ph.request.method, pp.hardware, pp.device, [ph.plan]))["modes"][0]
            one.pop("files", None)
            phases.append({"name": ph.name, "start_from": ph.start_from, "adapters": ph.adapters,
                           "reference": ph.reference, "reference_bytes": ph.reference_bytes,
                           "token_basis": ph.token_basis, "uncapped": to_jsonable(ph.uncapped), "plan": one})
        modes.append({"mode": pm.mode, "fits": pm.fits, "phases": phases,
                      "totals": to_jsonable(pm.totals),
                      "hours_max": pm.hours_max, "capped_share": pm.capped_share, "reasons": pm.reasons,
                      "warnings": pm.warnings, "files": (files or {}).get(pm.mode, [])})
    return {"pipeline": pp.pipeline, "model": pp.model_id, "hardware": pp.hardware, "device": pp.device,
            "modes": modes, "notes": pp.notes, "rates": pp.rates,
            "units": {"*_bytes": "bytes", "*_seconds": "seconds", "*_watts": "watts", "hours": "hours"}}


def render_pipeline(pp, out, files: dict[str, list[str]] | None = None) -> None:
    from trainfit.cli.render_plan import setting_line

    for note in pp.notes:
        out.print(f"[dim]{note}[/]")
    for pm in pp.modes:
        out.print(f"\n[bold]{pm.mode.upper()}[/]  {pp.pipeline}: "
                  + ("[green]fits[/]" if pm.fits else "[red]does not fit[/]"))
        for ph in pm.phases:
            mp, run = ph.plan, ph.plan.run
            if not mp.fits or mp.setup is None:
                out.print(f"  {ph.name}: [red]nothing fits this mode's memory budget[/]")
                continue
            when = f"{run.hours:.1f} h, {run.steps:,} steps" if run is not None and run.hours is not None else "-"
            out.print(f"  {ph.name}: {setting_line(mp.setup)}")
            out.print(f"    memory {mp.memory_used_bytes / GIB:.2f} of {(mp.memory_budget_bytes or 0) / GIB:.2f} GiB, "
                      f"{when}; {ph.token_basis}")
        t = pm.totals
        if t.hours is not None:
            cost = f", ${t.rental_usd:,.2f} rental" if t.rental_usd is not None else ""
            out.print(f"  total: {t.hours:.1f} h, {t.energy_kwh or 0:.2f} kWh, electricity "
                      f"{t.electricity_cost or 0:.2f}{cost}")
        for r in pm.reasons:
            out.print(f"  • {r}")
        for w in pm.warnings:
            out.print(f"  [yellow]! {w}[/]")
        for path in (files or {}).get(pm.mode, []):
            out.print(f"  [dim]wrote {path}[/]")


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.plan_request import invoked
    from trainfit.core.plan.pipeline import plan_pipeline

    req, data = build_pipeline_request(args)
    pp = plan_pipeline(req)
    files: dict[str, list[str]] = {}
    if args.out is not None:
        files = write_pipeline_exports(pp, Path(args.out), force=args.force, data=data, command=invoked(args))
    if args.json:
        from trainfit.cli.output import print_json

        print_json(pipeline_document(pp, files))
    else:
        from trainfit.cli.output import console

        out = console()
        out.print(f"[bold]trainfit plan --pipeline {pp.pipeline}[/]: {pp.model_id} on {pp.hardware} ({pp.device})")
        if pp.rates:
            out.print(f"[dim]{pp.rates['text']}[/]")
        render_pipeline(pp, out, files)
    # exit 3 when no mode has every phase fitting (nothing to train)
    return EXIT_OK if any(m.fits for m in pp.modes) else EXIT_DOES_NOT_FIT
