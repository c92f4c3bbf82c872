"""`trainfit analyze`: the hardware analysis screen (profile, LLM-training score, warnings,
suggestions) for this machine or for hardware named with --hardware."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "analyze hardware for LLM training: profile, performance score, warnings, suggestions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile-only", action="store_true",
                        help="show the analysis without pointing to configurations")
    parser.add_argument("--benchmark", action="store_true", help="measure instead of using datasheet figures")
    parser.add_argument("--psu-watts", type=float, metavar="W", help="your power supply's rating in watts")
    parser.add_argument("--hardware", metavar="SPEC",
                        help="analyze other hardware: a catalog name ('rtx-4090', '2x rtx-4090', 'cpu') "
                             "or a saved profile JSON")
    parser.add_argument("--json", action="store_true", help="print the analysis as one JSON document")


def analyze(args: argparse.Namespace) -> dict[str, Any]:
    """The Python twin: profile + analysis as the JSON document `--json` prints."""
    from trainfit.core.serde import to_jsonable
    from trainfit.hardware.analysis import analyze_profile
    from trainfit.hardware.profiler import build_profile, check_psu_watts

    check_psu_watts(args.psu_watts)
    if args.hardware:
        from trainfit.core.hardware_spec import resolve_hardware

        profile = resolve_hardware(args.hardware)
    else:
        profile = build_profile(benchmark=args.benchmark, psu_watts=args.psu_watts)
    analysis = analyze_profile(profile)
    return {"profile": profile, "analysis": to_jsonable(analysis)}


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import console, print_json, say

    if args.hardware and args.benchmark:
        say("note: --benchmark measures this machine; it is ignored with --hardware")
        args.benchmark = False
    result = analyze(args)
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
    if not args.profile_only:
        out.print(f"\n🎯 RECOMMENDED CONFIGURATIONS: {a['configurations']}")
    if a["suggestions"]:
        out.print("\n[bold]💡 OPTIMIZATION SUGGESTIONS:[/bold]")
        for line in a["suggestions"]:
            out.print(f" - {line}")
    if a["warnings"]:
        out.print("\n[bold]⚠️  WARNINGS:[/bold]")
        for line in a["warnings"]:
            out.print(f" - {line}")
    return 0
