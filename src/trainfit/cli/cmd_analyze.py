"""`trainfit analyze`: the hardware analysis screen (seeds/001 §6): profile summary, the LLM-training
score with its reasoning, three recommended configurations (conservative / balanced / extreme) for
a goal, suggestions and warnings — for this machine or for hardware named with --hardware.

The embedded default goal is pretraining from scratch (the planner picks the size per mode from
the Chinchilla budget and the mode's time); --model / --method plan a fine-tune instead.
"""

from __future__ import annotations

import argparse
from trainfit.validate import arg
from pathlib import Path
from typing import Any

HELP = "analyze hardware for LLM training: profile, score, three recommended configurations, warnings"
DEFAULT_CONFIG_DIR = "trainfit-configs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-only", action="store_true", help="the analysis without configurations")
    parser.add_argument("--generate-configs", nargs="?", const=DEFAULT_CONFIG_DIR, metavar="DIR",
                        help=f"write each mode's config files into DIR/<mode>/ (default DIR: {DEFAULT_CONFIG_DIR})")
    parser.add_argument("--force", action="store_true", help="overwrite files --generate-configs finds")
    parser.add_argument("--benchmark", action="store_true", help="measure instead of using datasheet figures")
    parser.add_argument("--psu-watts", type=arg("psu_watts"), metavar="W", help="your power supply's rating in watts")
    parser.add_argument("--hardware", metavar="SPEC",
                        help="analyze other hardware: a catalog name ('rtx-4090', '2x rtx-4090', 'cpu') "
                             "or a saved profile JSON")
    parser.add_argument("--model", help="plan a fine-tune of this model instead of the default goal "
                        "(pretraining from scratch)")
    parser.add_argument("--method", default=None, help="method for --model (default auto), or pretrain")
    # The workload, as `trainfit plan` takes it: the plan's run time, steps and token budget need it,
    # and its advice names these flags.
    parser.add_argument("--examples", type=arg("examples"), help="training examples (DPO: pairs)")
    parser.add_argument("--dataset-tokens", type=arg("dataset_tokens"), help="tokens in the dataset (one epoch)")
    parser.add_argument("--data", action="append", help="data file or directory: its size and row lengths "
                        "(repeatable)")
    parser.add_argument("--dataset", metavar="HUB_ID", help="a Hub dataset ('owner/name'): its size metadata")
    parser.add_argument("--json", action="store_true", help="print the analysis as one JSON document")


def _plan_args(args: argparse.Namespace) -> argparse.Namespace:
    """The `trainfit plan` arguments of the goal analyze shows."""
    from trainfit.cli import cmd_plan

    p = argparse.ArgumentParser()
    cmd_plan.add_arguments(p)
    plan_args = p.parse_args([])
    plan_args.model = args.model
    plan_args.method = args.method or ("auto" if args.model else "pretrain")
    plan_args.out = args.generate_configs
    plan_args.force = args.force
    for name in WORKLOAD_FLAGS:
        setattr(plan_args, name, getattr(args, name, None))
    return plan_args


WORKLOAD_FLAGS = ("examples", "dataset_tokens", "data", "dataset")  # passed on to the plan as given


def analyze(args: argparse.Namespace) -> dict[str, Any]:
    """The Python twin: profile + analysis (+ plan) as the JSON document `--json` prints."""
    from trainfit.cli.output import say
    from trainfit.core.serde import to_jsonable
    from trainfit.hardware.analysis import analyze_profile
    from trainfit.hardware.profiler import build_profile, check_psu_watts

    check_psu_watts(args.psu_watts)
    owned = args.hardware is None
    if args.hardware is not None:  # '' is refused as every command refuses it, not this machine
        from trainfit.core.machines.hardware_spec import resolve_hardware

        profile = resolve_hardware(args.hardware)
        owned = profile.source.startswith("file:")
    else:
        profile = build_profile(benchmark=args.benchmark, psu_watts=args.psu_watts, on_measure=say)
    analysis = analyze_profile(profile, owned=owned)
    doc: dict[str, Any] = {"profile": profile, "analysis": to_jsonable(analysis)}
    if not args.profile_only:
        from trainfit.cli import cmd_plan
        from trainfit.cli.plan_document import plan_document
        from trainfit.cli.plan_request import build_request, command_line, data_paths
        from trainfit.core.plan.planner import MemoryUnknownError, plan

        plan_args = _plan_args(args)
        req = build_request(plan_args, hardware=profile)
        try:
            result = plan(req)
        except MemoryUnknownError as exc:  # the analysis still stands; its warnings say why
            doc["plan"] = {"unavailable": exc.message}
            return doc
        files: dict[str, list[str]] = {}
        if plan_args.out:
            command = command_line(_reproduce(plan_args))
            files = cmd_plan.write_exports(result, req, Path(plan_args.out), force=plan_args.force,
                                           data=data_paths(plan_args.data), command=command,
                                           flag="--generate-configs")
        doc["plan"] = plan_document(result, files)
        doc["_plan"], doc["_files"] = result, files
    return doc


def _reproduce(plan_args: argparse.Namespace) -> list[str]:
    words = [plan_args.model] if plan_args.model else []
    for name in WORKLOAD_FLAGS:
        value = getattr(plan_args, name, None)
        for item in (value if isinstance(value, list) else [] if value is None else [value]):
            words += [f"--{name.replace('_', '-')}", str(item)]
    return words + ["--method", plan_args.method, "--out", str(plan_args.out)]


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import console, print_json, say

    if args.hardware and args.benchmark:
        say("note: --benchmark measures this machine; it is ignored with --hardware")
        args.benchmark = False
    if args.profile_only and args.generate_configs:
        from trainfit.errors import BadInputError

        raise BadInputError("--generate-configs writes the configurations that --profile-only leaves out: "
                            "give one of them")
    if args.generate_configs is not None:
        from trainfit.validate import output_dir

        output_dir(args.generate_configs, "--generate-configs")
        from trainfit.core.plan.modes import MODES
        from trainfit.export.publish import check_folders

        check_folders(args.generate_configs, list(MODES), "--generate-configs")
    result = analyze(args)
    plan_result, files = result.pop("_plan", None), result.pop("_files", {})
    if args.json:
        print_json(result)
        return 0
    from trainfit.cli.render_profile import render_profile

    out = console()
    a = result["analysis"]
    out.print("[bold]🔍 HARDWARE ANALYSIS COMPLETE[/bold]")
    render_profile(result["profile"], out, title="📊 System Profile")
    out.print(f"\n[bold]⚡ Performance Score: {a['score']:.1f}/10[/bold] ({a['label']})")
    for line in a["reasoning"]:
        out.print(f"   {line}")
    if plan_result is not None:
        from trainfit.cli.render_plan import render_plan

        goal = plan_result.modes[0].model_id if args.model else "pretraining from scratch (size chosen per mode)"
        out.print(f"\n[bold]🎯 RECOMMENDED CONFIGURATIONS[/bold] for {goal} on {plan_result.device}:\n")
        render_plan(plan_result, out, files=files)
        if not files:
            out.print("Write them as config files: trainfit analyze --generate-configs "
                      "(or trainfit plan MODEL --out DIR for a fine-tune)")
    if a["suggestions"]:
        out.print("\n[bold]💡 OPTIMIZATION SUGGESTIONS:[/bold]")
        for line in a["suggestions"]:
            out.print(f" - {line}")
    if a["warnings"]:
        out.print("\n[bold]⚠️  WARNINGS:[/bold]")
        for line in a["warnings"]:
            out.print(f" - {line}")
    return 0
