"""`trainfit plan`'s flags -> the PlanRequest the library planner takes (core.plan.planner.plan),
with every flag checked before any planning; shared by `plan`, `plan --pipeline` and `analyze`."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from trainfit.cli.framework_arg import chosen
from trainfit.errors import BadInputError, short_repr

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(h|hr|hours?|m|min|minutes?|d|days?)?\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|tib|tb)?\s*$", re.IGNORECASE)


def parse_hours(text: str | None, flag: str = "--time-budget") -> float | None:
    if text is None:
        return None
    m = _DURATION.match(str(text))
    if not m:
        raise BadInputError(f"{flag}: {short_repr(text)} is not a duration (valid: 2h, 90m, 1.5d, or hours as a number > 0)")
    value = float(m.group(1))
    unit = (m.group(2) or "h").lower()[0]
    hours = value * {"h": 1.0, "m": 1 / 60, "d": 24.0}[unit]
    if not 0 < hours < float("inf"):
        raise BadInputError(f"{flag}: must be more than zero and finite, got {short_repr(text)}")
    return hours


def parse_bytes(text: str | None, flag: str = "--memory-budget") -> int | None:
    if text is None:
        return None
    m = _SIZE.match(str(text))
    if not m:
        raise BadInputError(f"{flag}: {short_repr(text)} is not a size (valid: 3GiB, 512MiB, 24GB)")
    unit = (m.group(2) or "gib").lower()
    mult = {"gib": 2**30, "gb": 10**9, "mib": 2**20, "mb": 10**6, "tib": 2**40, "tb": 10**12}[unit]
    value = float(m.group(1)) * mult  # 400 digits is a float infinity, not an integer
    if not 0 < value <= MAX_MEMORY_BUDGET_BYTES:
        raise BadInputError(f"{flag}: must be more than 0 and at most 1024 TiB, got {short_repr(text)}")
    return int(value)


MAX_MEMORY_BUDGET_BYTES = 1 << 50  # 1024 TiB: far above any device's memory


def _hardware(spec: str | None):
    if spec is not None and not spec.strip():
        raise BadInputError("--hardware: empty (give a catalog machine such as 'rtx-4090', or a profile JSON)")
    from trainfit.cli.cmd_estimate import load_hardware

    return load_hardware(spec)


def build_request(args: argparse.Namespace, hardware=None):
    from trainfit.core.plan.modes import MODES
    from trainfit.core.plan.planner import PLAN_METHODS, PlanRequest
    from trainfit.core.setup import METHOD_ALIASES
    from trainfit.hub import resolve_model

    method = METHOD_ALIASES.get(args.method, args.method)
    if method not in PLAN_METHODS:
        raise BadInputError(f"--method: {args.method!r} is not one of {', '.join(PLAN_METHODS)} (sft = full)")
    modes = tuple(args.mode or MODES)
    for m in modes:
        if m not in MODES:
            raise BadInputError(f"--mode: {m!r} is not one of {', '.join(MODES)}")
    from trainfit.export.tools import check_method, check_tool

    args.for_tool = check_tool(getattr(args, "for_tool", None))
    if method != "auto":
        check_method(args.for_tool, method)  # a method the tool lacks: refused before planning
    _framework_for_tool(args)
    check_launchers(args)
    if args.out is not None:
        from trainfit.validate import output_dir

        output_dir(args.out, "--out")
        from trainfit.export.publish import check_folders

        check_folders(args.out, list(modes), "--out")  # a link planted at OUT/<mode>: refused before planning
    data_paths(args.data)  # bad data paths fail before any planning
    dataset = dataset_info(args)
    model = resolve_model(args.model) if args.model else None
    from trainfit.cli import plan_flavor

    flavor = plan_flavor.resolve(args)  # --flavor ID [--spot]: hardware, price, spot terms
    hw = hardware if hardware is not None else flavor.hardware if flavor is not None else _hardware(args.hardware)
    from trainfit.core.run.power import DEFAULT_PRICE_PER_KWH

    from trainfit.cli.cmd_estimate import calibration_source, machine_calibration
    from trainfit.core.plan.hardware_rules import rules_for

    named = args.hardware if flavor is None else flavor.flavor_id  # a rented flavor is not this machine
    cal = machine_calibration(hw, rules_for(hw).device, named_hardware=named)
    calibration = {}
    if cal is not None:
        calibration = {"memory_factor": cal.memory_factor or 1.0, "step_time_factor": cal.step_time_factor or 1.0,
                       "calibration_source": calibration_source(cal)}
    usd_per_hour = args.usd_per_hour if flavor is None else flavor.usd_per_hour
    if args.budget is not None and usd_per_hour is None:
        usd_per_hour = rental_price(hw)

    return PlanRequest(
        hardware=hw, method=method, model=model, seq_len=args.seq_len, target_batch=args.target_batch,
        dataset_tokens=args.dataset_tokens, examples=args.examples, epochs=args.epochs,
        time_budget_hours=parse_hours(args.time_budget), memory_budget_bytes=parse_bytes(args.memory_budget),
        memory_share=args.memory_share, tokens_per_param=args.tokens_per_param, usd_per_hour=usd_per_hour,
        budget_usd=args.budget, price_per_kwh=DEFAULT_PRICE_PER_KWH if args.price_per_kwh is None else args.price_per_kwh,
        vocab_size=args.vocab, modes=modes, **calibration, dataset=dataset, **_image_knobs(args),
        spot=flavor.spot if flavor is not None else None,
        framework=chosen(args, this_machine=args.hardware is None and flavor is None))


def _framework_for_tool(args: argparse.Namespace) -> None:
    """--for TOOL plans the tool's run: its framework profile sets every mode's memory and time unless
    --framework names a release of it. trl (the default) is trainfit's own run and the files it writes."""
    tool = args.for_tool
    if tool in (None, "trl"):
        return
    from trainfit.core.frameworks import resolve_framework

    wanted = resolve_framework(tool)
    if getattr(args, "framework", None) is None:
        args.framework = tool
    elif resolve_framework(args.framework).name != wanted.name:
        raise BadInputError(f"--framework {args.framework} describes another tool than --for {tool}: drop "
                            f"--framework, or give a release of {tool} (e.g. --framework {tool}@VERSION)")


def _image_knobs(args: argparse.Namespace) -> dict:
    """--image-size / --images-per-example as estimate reads them: an image size alone means one image
    per example (checked against the model by the planner, as estimate checks them)."""
    size = getattr(args, "image_size", None)
    images = getattr(args, "images_per_example", None)
    if images is None:
        images = 1 if size else 0
    return dict(image_size=size or 0, images_per_example=images)


def dataset_info(args: argparse.Namespace):
    """The dataset's size for the data I/O plan: --data (local) or --dataset (Hub), with the user's
    --dataset-tokens / --examples over measured counts (trainfit.dataset_size)."""
    from trainfit.dataset_size import hub_dataset_info, local_dataset_info, with_counts

    hub = getattr(args, "dataset", None)
    if hub is not None and args.data:
        raise BadInputError("--dataset: give local data with --data PATH or a Hub dataset with --dataset HUB_ID, "
                            "not both")
    info = local_dataset_info(data_paths(args.data)) if args.data else hub_dataset_info(hub) if hub is not None else None
    return with_counts(info, tokens=args.dataset_tokens, examples=args.examples)


def rental_price(hw) -> float:
    """The cheapest on-demand hourly price of a cloud flavor with exactly this hardware's GPUs."""
    from trainfit.core.cloud.catalog import load_cloud_catalog

    gpu = hw.gpus[0].catalog_id if hw.gpus else None
    prices = [f.usd_per_hour for f in load_cloud_catalog().flavors
              if gpu and f.gpu == gpu and f.gpu_count == len(hw.gpus) and f.usd_per_hour is not None]
    if not prices:
        raise BadInputError(f"--budget: no cloud flavor in the catalog has exactly {len(hw.gpus)} x {gpu or 'CPU'}",
                            hint="give the price with --usd-per-hour")
    return min(prices)


def data_paths(paths: list[str] | None) -> list[str] | None:
    if not paths:
        return None
    out = []
    for p in paths:
        if p.startswith("builtin:"):
            out.append(p)
            continue
        path = Path(p).expanduser()
        if not p.strip():
            raise BadInputError("--data: empty path", hint="give a data file or directory, or builtin:tiny-corpus")
        if not path.exists():
            raise BadInputError(f"--data: {p} does not exist")
        out.append(str(path.resolve()))
    return out


def check_launchers(args: argparse.Namespace) -> tuple[str, ...]:
    """--launcher ENGINE (repeatable), checked before planning."""
    from trainfit.export.cluster_job import LAUNCHERS

    given = tuple(dict.fromkeys(getattr(args, "launcher", None) or ()))
    for name in given:
        if name not in LAUNCHERS:
            raise BadInputError(f"--launcher: {short_repr(name)} is not one of {', '.join(LAUNCHERS)}")
    if given and getattr(args, "out", None) is None:
        raise BadInputError("--launcher: writes a job spec next to launch.sh; give --out DIR too")
    return given


def command_line(argv: list[str] | None = None) -> str:
    words = ["trainfit", "plan", *(argv if argv is not None else sys.argv[2:])]
    return " ".join(shlex.quote(w) for w in words)


def invoked(args: argparse.Namespace) -> str:
    """The plan command as it was given (through main(argv) too, not only from the shell)."""
    argv = getattr(args, "argv", None)
    if argv is None or "plan" not in argv:
        return command_line()
    return command_line(argv[argv.index("plan") + 1:])
