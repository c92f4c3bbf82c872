"""`trainfit plan`: three ready-to-run configurations (conservative, balanced, extreme) for a goal on
this machine or on named hardware, and with --out the files Transformers, TRL, PEFT, Accelerate,
DeepSpeed and `trainfit train` load."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from trainfit.cli.framework_arg import add_framework_argument, chosen, plan_framework
from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError, short_repr
from trainfit.validate import arg

HELP = "plan three configurations (conservative / balanced / extreme) and write their config files"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(h|hr|hours?|m|min|minutes?|d|days?)?\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|tib|tb)?\s*$", re.IGNORECASE)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from trainfit.core.plan.modes import MODES
    from trainfit.core.plan.planner import PLAN_METHODS
    from trainfit.core.setup import DEFAULT_METHOD

    p.add_argument("model", nargs="?", help="catalog id or alias, a local model dir or config.json, or a shape "
                   "(shape:125m); omit with --method pretrain to let the planner pick the size")
    p.add_argument("--method", default=DEFAULT_METHOD, help=f"{', '.join(PLAN_METHODS)} (sft = full; default "
                   f"{DEFAULT_METHOD} as estimate and cloud: full fine-tuning, falling back to LoRA, then QLoRA, "
                   "where it does not fit; auto is the same rule)")
    p.add_argument("--mode", action="append", help=f"{', '.join(MODES)} (repeatable; default all three)")
    p.add_argument("--hardware", help="catalog machine ('rtx-4090', '2x a100-80gb', 'm2-16gb', 'cpu') or a profile "
                   "JSON; default: this machine")
    from trainfit.cli.knob_flags import add_knob_flags

    add_knob_flags(p, "plan", only=("seq_len",))  # declared in trainfit.core.knobs
    p.add_argument("--target-batch", type=arg("target_batch"), help="effective batch to keep (default: 16 / 32 / 64 by mode)")
    p.add_argument("--examples", type=arg("examples"), help="training examples (DPO: pairs)")
    p.add_argument("--pipeline", help="plan phases that run in order, joined by their hand-offs: sft+dpo, "
                   "pretrain+sft, pretrain+sft+dpo (--method is the SFT phase's; docs/pipeline.md)")
    p.add_argument("--pairs", type=arg("pairs"), help="with --pipeline: DPO preference pairs (default: --examples)")
    p.add_argument("--dataset-tokens", type=arg("dataset_tokens"), help="tokens in the dataset (one epoch)")
    from trainfit.cli.cmd_estimate import add_image_arguments

    add_image_arguments(p)
    p.add_argument("--epochs", type=arg("epochs"), default=1.0)
    p.add_argument("--time-budget", help="longest run, e.g. 2h, 90m, 1.5d (default: each mode's)")
    p.add_argument("--memory-budget", help="memory per device to plan for, e.g. 3GiB (default: what the device has)")
    p.add_argument("--memory-share", type=arg("memory_share"), help="share of the memory each mode may use (default .5/.75/.95)")
    p.add_argument("--tokens-per-param", type=arg("tokens_per_param"), help="pretraining token budget (default 12 / 20 / 25)")
    p.add_argument("--vocab", type=arg("vocab"), default=32000, help="pretraining vocabulary size (default 32000)")
    p.add_argument("--usd-per-hour", type=arg("usd_per_hour"), help="hourly price of the machine (rented hardware)")
    p.add_argument("--flavor", metavar="ID", help="plan for a cloud flavor (trainfit cloud): its GPUs and its price")
    p.add_argument("--spot", action="store_true", help="with --flavor: its spot price and interruption rate (checkpoint "
                   "cadence, expected cost incl. re-done work, safety.interruption_hours in the run config)")
    p.add_argument("--prices", help="with --flavor: a price file (as trainfit cloud --prices), e.g. a spot price and "
                   "spot_interruption for an AWS flavor")
    p.add_argument("--budget", type=arg("budget_usd"), help="most dollars to spend (with --usd-per-hour)")
    p.add_argument("--price-per-kwh", type=arg("price_per_kwh"), default=None, help="electricity price (default 0.17)")
    p.add_argument("--data", action="append", help="data file or directory for the exported run config "
                   "(repeatable; default: the shipped sample set); its size and row lengths plan the data I/O")
    p.add_argument("--dataset", metavar="HUB_ID", help="a Hub dataset ('owner/name' or 'owner/name:config'): its "
                   "size metadata plans streaming vs download, the cache and the token budget")
    p.add_argument("--out", help="write each mode's files into OUT/<mode>/")
    p.add_argument("--launcher", action="append", metavar="ENGINE", help="with --out: also write the job spec for "
                   "slurm (slurm.sbatch), skypilot (skypilot.yaml, skypilot-job.yaml) or kubernetes (pytorchjob.yaml), "
                   "repeatable; docs: README 'Running on a cluster'")
    p.add_argument("--for", dest="for_tool", metavar="TOOL", default="trl", help="with --out, also write the "
                   "native config of the tool you train with: trl (default: trainfit's run config and the TRL / "
                   "Accelerate / DeepSpeed files only), axolotl, llama-factory, torchtune, litgpt")
    p.add_argument("--force", action="store_true", help="overwrite files that exist in --out")
    add_framework_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    from trainfit.cli import plan_probe

    plan_probe.add_arguments(p)  # --probe-seconds, --no-probe


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
    _launchers(args)
    if args.out is not None:
        from trainfit.validate import output_dir

        output_dir(args.out, "--out")
        from trainfit.export.publish import check_folders

        check_folders(args.out, list(modes), "--out")  # a link planted at OUT/<mode>: refused before planning
    _data(args.data)  # bad data paths fail before any planning
    dataset = dataset_info(args)
    model = resolve_model(args.model) if args.model else None
    from trainfit.cli import plan_flavor

    flavor = plan_flavor.resolve(args)  # --flavor ID [--spot]: hardware, price, spot terms
    hw = hardware if hardware is not None else flavor.hardware if flavor is not None else _hardware(args.hardware)
    from trainfit.core.power import DEFAULT_PRICE_PER_KWH

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


def plan_for(model: str | None = None, **flags):
    """Python twin of `trainfit plan` (without --pipeline / --out): (Plan, PlanRequest), what it prints.
    Keyword flags are the command's long options with underscores (method="lora", flavor="t4-small")."""
    from trainfit.core.plan.planner import plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([] if model is None else [model])
    for key, value in flags.items():
        if not hasattr(args, key) or key in ("out", "pipeline", "json"):
            raise BadInputError(f"plan_for(): unknown option {key!r}")
        setattr(args, key, value)
    req = build_request(args)
    return plan(req), req


def dataset_info(args: argparse.Namespace):
    """The dataset's size for the data I/O plan: --data (local) or --dataset (Hub), with the user's
    --dataset-tokens / --examples over measured counts (trainfit.dataset_size)."""
    from trainfit.dataset_size import hub_dataset_info, local_dataset_info, with_counts

    hub = getattr(args, "dataset", None)
    if hub is not None and args.data:
        raise BadInputError("--dataset: give local data with --data PATH or a Hub dataset with --dataset HUB_ID, "
                            "not both")
    info = local_dataset_info(_data(args.data)) if args.data else hub_dataset_info(hub) if hub is not None else None
    return with_counts(info, tokens=args.dataset_tokens, examples=args.examples)


def rental_price(hw) -> float:
    """The cheapest on-demand hourly price of a cloud flavor with exactly this hardware's GPUs."""
    from trainfit.core.cloud_catalog import load_cloud_catalog

    gpu = hw.gpus[0].catalog_id if hw.gpus else None
    prices = [f.usd_per_hour for f in load_cloud_catalog().flavors
              if gpu and f.gpu == gpu and f.gpu_count == len(hw.gpus) and f.usd_per_hour is not None]
    if not prices:
        raise BadInputError(f"--budget: no cloud flavor in the catalog has exactly {len(hw.gpus)} x {gpu or 'CPU'}",
                            hint="give the price with --usd-per-hour")
    return min(prices)


def command_line(argv: list[str] | None = None) -> str:
    words = ["trainfit", "plan", *(argv if argv is not None else sys.argv[2:])]
    return " ".join(shlex.quote(w) for w in words)


def invoked(args: argparse.Namespace) -> str:
    """The plan command as it was given (through main(argv) too, not only from the shell)."""
    argv = getattr(args, "argv", None)
    if argv is None or "plan" not in argv:
        return command_line()
    return command_line(argv[argv.index("plan") + 1:])


def _launchers(args: argparse.Namespace) -> tuple[str, ...]:
    """--launcher ENGINE (repeatable), checked before planning."""
    from trainfit.export.cluster_job import LAUNCHERS

    given = tuple(dict.fromkeys(getattr(args, "launcher", None) or ()))
    for name in given:
        if name not in LAUNCHERS:
            raise BadInputError(f"--launcher: {short_repr(name)} is not one of {', '.join(LAUNCHERS)}")
    if given and getattr(args, "out", None) is None:
        raise BadInputError("--launcher: writes a job spec next to launch.sh; give --out DIR too")
    return given


def write_exports(plan, req, out_dir: Path, *, force: bool, data: list[str] | None, command: str,
                  flag: str = "--out", launchers: tuple[str, ...] = (), tool: str = "trl") -> dict[str, list[str]]:
    """Render every mode's files first (all validated), then publish them all in one step
    (trainfit.export.publish.write_tree); returns mode -> paths."""
    from trainfit.export.plan_files import plan_files
    from trainfit.export.publish import write_tree

    if plan.method == "inference":
        raise BadInputError(f"{flag}: an inference plan has no training files to write", hint=f"drop {flag}")
    rendered = {}
    for mp in plan.modes:
        if mp.fits:
            rendered[mp.mode] = plan_files(mp, req, command, data, base_dir=out_dir / mp.mode, launchers=launchers,
                                           tool=tool)
    if not rendered:
        return {}
    written = write_tree(out_dir, rendered, force=force, flag=flag)
    return {mode: [str(p) for p in paths] for mode, paths in written.items()}


def run(args: argparse.Namespace) -> int:
    if args.pipeline is not None and getattr(args, "for_tool", "trl") not in (None, "trl"):
        raise BadInputError("--for: a --pipeline plan is written for trainfit's own run (--for trl); plan each "
                            "phase on its own with --for")
    if args.pipeline is not None and getattr(args, "launcher", None):
        raise BadInputError("--launcher: writes one run's job spec; a --pipeline runs its phases in order, "
                            "so plan each phase with --launcher")
    if args.pipeline is not None:  # phases in order, one meta-config per mode (cli/plan_pipeline.py)
        from trainfit.cli.plan_pipeline import run as run_pipeline

        return run_pipeline(args)
    if args.pairs is not None:
        raise BadInputError("--pairs: counts the DPO phase of a --pipeline; for one DPO run give --examples")
    req = build_request(args)
    from trainfit.cli import plan_probe

    result, probe = plan_probe.plan(args, req)  # on this machine: confirmed by real steps
    files: dict[str, list[str]] = {}
    if args.out is not None:
        files = write_exports(result, req, Path(args.out), force=args.force, data=_data(args.data),
                              command=invoked(args), launchers=_launchers(args), tool=args.for_tool)
    if args.json:
        from trainfit.cli.output import print_json

        doc = plan_document(result, files)
        doc["framework"] = plan_framework(result, req, as_json=True)
        doc["cluster"] = cluster_document(req.hardware)
        if probe is not None:
            doc["probe"] = probe
        print_json(doc)
    else:
        from trainfit.cli.output import console
        from trainfit.cli.render_plan import render_plan

        out = console()
        out.print(f"[bold]trainfit plan[/]: {req.model.id if req.model else 'pretraining from scratch'} "
                  f"on {req.hardware.source} ({result.device})")
        if result.rates:
            out.print(f"[dim]{result.rates['text']}[/]")
        out.print("")
        render_plan(result, out, files=files)
        plan_framework(result, req, as_json=False)
        cluster = cluster_document(req.hardware)
        if cluster is not None:
            out.print(f"[bold]cluster[/] ({cluster['network']}): " + " ".join(
                f"{v['name']}={v['value']}" if v["value"] is not None else v["name"] for v in cluster["env"]))
            out.print(f"[dim]{cluster['checkpoint_dir']}[/]")
        plan_probe.render(probe, out)
    return EXIT_OK if any(m.fits for m in result.modes) else EXIT_DOES_NOT_FIT


def _data(paths: list[str] | None) -> list[str] | None:
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


def cluster_document(hw) -> dict | None:
    """A multi-node plan's rendezvous, interface and fabric variables (core.cluster_env) and the
    shared-storage rule for its checkpoints; None on one node."""
    if hw.node_count <= 1:
        return None
    from dataclasses import asdict

    from trainfit.core.cluster_env import cluster_env
    from trainfit.core.network_catalog import get_network

    network = get_network(hw.nodes.network) if hw.nodes.network else None
    return {"network": network.id if network else None, "env": [asdict(v) for v in cluster_env(network)],
            "checkpoint_dir": "TRAINFIT_CHECKPOINT_DIR: the run directory (checkpoints) must be on storage every "
                              "node mounts; trainfit train refuses a node-local one (relative, /tmp, /local, "
                              "/scratch-local, ..., or a local filesystem type)"}


def plan_document(result, files: dict[str, list[str]] | None = None) -> dict:
    """The Plan JSON (DESIGN: per mode the setup, its estimate, reasons, warnings, files)."""
    from trainfit.cli.output import device_memory_json
    from trainfit.core.serde import to_jsonable

    modes = []
    for mp in result.modes:
        d = to_jsonable(mp)
        d.pop("model", None)
        if mp.memory is not None:
            d["memory"] = {"devices": [device_memory_json(dev) for dev in mp.memory.devices], "params_total": mp.memory.params_total,
                           "params_trainable": mp.memory.params_trainable}
        d["files"] = (files or {}).get(mp.mode, [])
        modes.append(d)
    return {"method": result.method, "hardware": result.hardware, "device": result.device, "modes": modes,
            "notes": result.notes, "host_ram_usable_bytes": result.host_ram_usable_bytes, "rates": result.rates,
            "units": {"*_bytes": "bytes", "*_seconds": "seconds", "*_watts": "watts", "hours": "hours"}}
