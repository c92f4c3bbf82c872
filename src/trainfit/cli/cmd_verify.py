"""`trainfit verify RUN_CONFIG`: run a few real steps, compare measured and predicted memory and
step time, and store the ratios as this machine's calibration."""

from __future__ import annotations

import argparse
import dataclasses

from trainfit.cli.framework_arg import add_framework_argument, chosen, profile_json
from trainfit.core.frameworks import describe

from trainfit.train.calibration import DEFAULT_TIMED_STEPS, DEFAULT_WARMUP_STEPS
from trainfit.validate import arg

HELP = "run a few real steps of a run config and compare memory and speed with the predictions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="RUN_CONFIG", help="run config YAML (see docs/run-config.md)")
    parser.add_argument("--steps", type=arg("timed_steps"), default=DEFAULT_TIMED_STEPS, metavar="N",
                        help=f"timed steps after warm-up (default {DEFAULT_TIMED_STEPS})")
    parser.add_argument("--warmup", type=arg("warmup_timed_steps"), default=DEFAULT_WARMUP_STEPS, metavar="N",
                        help=f"untimed warm-up steps (default {DEFAULT_WARMUP_STEPS})")
    parser.add_argument("--no-save", action="store_true", help="do not store the calibration")
    add_framework_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def _gib(n: int | None) -> str:
    return "unavailable" if n is None else f"{n / 2**30:.3f} GiB"


def render_report(r) -> list[str]:
    """Lines of the human report (GiB = 2^30 bytes)."""
    ratio = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
    sec = lambda v: "unavailable" if v is None else f"{v:.4f} s"  # noqa: E731
    lines = [
        f"verify {r.method} {r.model} on {r.device} ({r.steps} steps)",
        f"  tensor peak   measured {_gib(r.measured_tensor_peak_bytes)}   predicted "
        f"{_gib(r.predicted_tensor_peak_bytes)}   ratio {ratio(r.memory_ratio)}",
        f"  peak RSS      measured {_gib(r.measured_peak_rss_bytes)}   predicted total {_gib(r.predicted_total_bytes)}",
        f"  step time     measured {sec(r.measured_step_seconds)}   predicted {sec(r.predicted_step_seconds)}   "
        f"ratio {ratio(r.step_time_ratio)}",
    ]
    if r.measured_cuda_reserved_bytes is not None:
        lines.append(f"  CUDA reserved {_gib(r.measured_cuda_reserved_bytes)}")
    for key, why in r.unavailable.items():
        lines.append(f"  {key}: {why}")
    lines.append(f"  calibration: {r.calibration_file or 'not stored'} (machine {r.fingerprint})")
    return lines


def verify(config: str, *, steps: int = DEFAULT_TIMED_STEPS, warmup: int = DEFAULT_WARMUP_STEPS, save: bool = True,
           log=None, framework: str | None = None):
    """Python twin: returns the VerifyReport."""
    from trainfit.errors import BadInputError
    from trainfit.config.run_config import load_run_config

    if steps < 1 or warmup < 0:
        raise BadInputError("--steps must be >= 1 and --warmup >= 0")
    cfg = load_run_config(config)  # a bad config fails before torch is imported
    from trainfit.config.run_config import own_run_problem, refuse_foreign_framework

    if framework is not None:  # verify measures trainfit's own run: only it can be compared and calibrated
        problem = own_run_problem(dataclasses.replace(cfg, framework=framework), "trainfit verify")
        if problem is not None:
            raise BadInputError(problem.replace("framework: ", "--framework ", 1).replace(
                "drop the key (or set framework: trainfit)", "drop --framework"))
    refuse_foreign_framework(cfg, "trainfit verify")
    from trainfit.errors import require_extra

    for module in ("torch", "transformers", "trl"):  # a core-only install: exit 4 naming the extra, as train does
        require_extra(module, "train")
    from trainfit.train.verify import verify_run

    return verify_run(cfg, warmup=warmup, timed=steps, save=save, log=log)


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import print_json, say
    from trainfit.train.environment import quiet_libraries

    with quiet_libraries():  # library warnings are not the user's business
        report = verify(args.config, steps=args.steps, warmup=args.warmup, save=not args.no_save, log=say,
                        framework=args.framework)
    own = chosen(args, this_machine=True)  # what verify measured and predicted: trainfit's own run here
    if args.json:
        from trainfit.core.serde import to_jsonable

        doc = to_jsonable(report)
        doc["framework"] = profile_json(own)
        print_json(doc)
    else:
        for line in render_report(report):
            print(line)
        print(f"  figures for: {describe(own)}")
    return 0
