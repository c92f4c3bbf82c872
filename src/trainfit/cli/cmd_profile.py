"""`trainfit profile`: detect this machine's hardware (CPU, RAM, GPUs, disks, power)."""

from __future__ import annotations

import argparse

from trainfit.core.machines.profile import HardwareProfile
from trainfit.validate import arg

HELP = "profile this machine's hardware (CPU, RAM, GPUs, storage, power); --json for the data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the profile as one JSON document")
    parser.add_argument("--benchmark", action="store_true",
                        help="also measure RAM bandwidth, CPU/GPU matmul speed and disk speed (under 30 s)")
    parser.add_argument("--out", metavar="FILE", help="write the profile JSON to FILE (atomically)")
    parser.add_argument("--psu-watts", type=arg("psu_watts"), metavar="W", help="your power supply's rating in watts")
    parser.add_argument("--quick", action="store_true",
                        help="CPU, RAM and GPUs only (skips the disk test, RAPL and network)")
    parser.add_argument("--bandwidth-url", metavar="URL",
                        help="measure download speed from this URL (else $TRAINFIT_BANDWIDTH_URL)")


def collect(args: argparse.Namespace) -> HardwareProfile:
    """The Python twin: the profile that `run` prints."""
    from trainfit.cli.output import say
    from trainfit.hardware.profiler import build_profile

    return build_profile(benchmark=args.benchmark, psu_watts=args.psu_watts, quick=args.quick,
                         bandwidth_url=args.bandwidth_url, on_measure=say)


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import console, say, write_atomic
    from trainfit.hardware.profiler import check_psu_watts
    from trainfit.validate import output_file

    check_psu_watts(args.psu_watts)  # before any probing: bad input fails fast
    if args.out is not None:
        output_file(args.out, "--out")
    profile = collect(args)
    if args.out is not None:
        write_atomic(args.out, profile.to_json() + "\n")
        say(f"profile written to {args.out}")
    if args.json:
        import sys

        sys.stdout.write(profile.to_json() + "\n")
        return 0
    from trainfit.cli.render_profile import render_profile

    render_profile(profile, console())
    return 0
