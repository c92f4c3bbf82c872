"""`trainfit report RUN_DIR`: a summary, PNG plots and one self-contained report.html of a run
directory written by `trainfit train` (see trainfit/report/)."""

from __future__ import annotations

import argparse

HELP = "report on a run directory: summary, plots (memory, loss, speed, thermals, events), one HTML page"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `trainfit train --out`")
    parser.add_argument("--out", metavar="DIR",
                        help="where to write report.html and the PNG plots (default: RUN_DIR/report)")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier report in --out (a directory holding anything else is never replaced)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary and the written files as JSON on stdout")


def report(run_dir: str, out: str | None = None, force: bool = False) -> dict:
    """Python twin of the command: writes the report and returns {"run_dir", "out", "html",
    "plots", "plots_left_out", "summary"} (what --json prints)."""
    from trainfit.report import make_report

    return make_report(run_dir, out, force=force)


def render(result: dict) -> list[str]:
    """Lines of the human output."""
    from trainfit.report.html_page import summary_rows
    from trainfit.report.plots import TITLES

    lines = [f"report on {result['run_dir']}"]
    rows = summary_rows(result["summary"])
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    lines += [f"  note: {n}" for n in result["summary"]["notes"]]
    lines += [f"  {TITLES[name].lower()} plot left out: {why}" for name, why in result["plots_left_out"].items()]
    lines.append(f"wrote {result['html']} ({len(result['plots'])} plots inside, also as PNG files in {result['out']})")
    return lines


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import print_json

    result = report(args.run_dir, args.out, force=args.force)
    if args.json:
        print_json(result)
    else:
        for line in render(result):
            print(line)
    return 0
