"""`trainfit estimate`: memory of a training or inference setup, per device, with its parts.

No torch import on this path: the model comes from the catalog / config.json / a shape, the
hardware from the catalog, a profile JSON, or the quick live profile (CPU, RAM, GPUs).
"""

from __future__ import annotations

import argparse

from trainfit.cli.knob_flags import HelpAll, add_knob_flags, add_runtime_flag, knob_values, wording
from trainfit.core.knob_setup import setup_from_knobs
from trainfit.core.setup import TrainingSetup
from trainfit.cli.framework_arg import add_framework_argument, apply_to
from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError
from trainfit.validate import arg

HELP = "predict the memory of a training / inference setup and say whether it fits"
GIB = 1 << 30


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    """--image-size / --images-per-example, the same flags and checks in estimate and plan."""
    add_knob_flags(p, "plan", only=("image_size", "images_per_example"))


def add_arguments(p: argparse.ArgumentParser, *, show_all: bool = False) -> None:
    """The knob flags come from the declared table (trainfit.core.knobs); the others say which model,
    hardware and workload. Advanced flags are shown by --help-all only."""
    more = None if show_all else argparse.SUPPRESS
    p.add_argument("model", nargs="?", help="catalog id or alias, a local model dir or config.json, a shape "
                   "('shape:125m'), or a Hugging Face Hub id 'owner/name[@revision]' (config.json and safetensors "
                   "headers only; the lookup gives up after TRAINFIT_HUB_DEADLINE seconds, default 60)")
    p.add_argument("--help-all", action=HelpAll, add_all=lambda full: add_arguments(full, show_all=True),
                   help="every flag, the runtime keys and the knob table")
    add_knob_flags(p, "estimate", show_all=show_all)
    add_runtime_flag(p)
    p.add_argument("--dataset-tokens", type=arg("dataset_tokens"), default=None,
                   help="tokens in the training set: adds run time, energy and electricity cost")
    p.add_argument("--examples", type=arg("examples"), default=None, help="training examples, at the task's "
                   "typical length (data/typical_lengths.yaml), as plan sizes them")
    p.add_argument("--epochs", type=arg("epochs"), default=1.0)
    p.add_argument("--price-per-kwh", type=arg("price_per_kwh"), default=None,
                   help=more or "electricity price per kWh (default 0.17, the 2024 U.S. residential average)")
    p.add_argument("--no-calibration", action="store_true",
                   help=more or "ignore the measured/predicted ratio that `trainfit verify` stored for this machine")
    p.add_argument("--hardware", default=None, help="catalog machine ('rtx-4090', '2x a100-80gb', 't4', "
                   "'m2-16gb', 'cpu') or a profile JSON; default: this machine")
    p.add_argument("--params", default=None, help=more or "pretraining shape by size, e.g. 125m, 1.3b")
    p.add_argument("--layers", type=arg("layers"), help=more or "pretraining shape: layers (with --hidden, --heads)")
    p.add_argument("--hidden", type=arg("hidden"), help=more or "pretraining shape: hidden size")
    p.add_argument("--heads", type=arg("heads"), help=more or "pretraining shape: attention heads")
    p.add_argument("--vocab", type=arg("vocab"), default=32000,
                   help=more or "pretraining shape: vocabulary size (default 32000)")
    p.add_argument("--schema", action=SchemaAction, help=more or "print the JSON schema of the knobs and exit")
    add_framework_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


class SchemaAction(argparse.Action):
    """`--schema`: the JSON schema of the knobs (trainfit.core.knobs.json_schema) on stdout."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from trainfit.cli.output import print_json
        from trainfit.core.knobs import json_schema

        print_json(json_schema("estimate"))
        parser.exit(0)


def _model(args: argparse.Namespace):
    from trainfit.core.models import shapes as model_shapes
    from trainfit.hub import resolve_model

    dims = (args.layers, args.hidden, args.heads)
    if args.model:
        return resolve_model(args.model)
    if args.params:
        return model_shapes.parse_shape(args.params)
    if all(d is not None for d in dims):
        for name, v in zip(("--layers", "--hidden", "--heads"), dims):
            if v < 1:
                raise BadInputError(f"{name} must be >= 1, got {v}")
        return model_shapes.shape_from_dims(args.layers, args.hidden, args.heads, args.vocab)
    raise BadInputError("MODEL missing", hint="give a catalog id, a config.json, --params 125m, "
                        "or --layers/--hidden/--heads")


def build_setup(args: argparse.Namespace, hardware, spec=None) -> TrainingSetup:
    """The command's flags as knob values, through the table, to the setup (core.knob_setup)."""
    values = with_installed_versions(knob_values(args, "estimate"), args.hardware)
    return setup_from_knobs(values, hardware, spec, word=wording(args))


def with_installed_versions(values: dict, named_hardware: str | None) -> dict:
    """Without --hardware a run on this machine uses the installed bitsandbytes and transformers, so
    their versions are the defaults there (trainfit.core.runtime)."""
    from trainfit.core.runtime import BNB_QUANTS
    from trainfit.versions import installed_version

    if named_hardware is not None:
        return values
    values = dict(values)
    quant = values.get("quant") or ("nf4" if values.get("method") == "qlora" else None)
    if values.get("bitsandbytes_version") is None and quant in BNB_QUANTS:
        values["bitsandbytes_version"] = installed_version("bitsandbytes")
    if values.get("transformers_version") is None:
        values["transformers_version"] = installed_version("transformers")
    return values


def load_hardware(spec: str | None):
    """A catalog machine or profile JSON when named, else the quick live profile ('' is an
    error, not this machine)."""
    if spec is not None:
        from trainfit.core.machines.hardware_spec import resolve_hardware

        return resolve_hardware(spec)
    from trainfit.cli.output import say
    from trainfit.hardware.profiler import build_profile

    return build_profile(quick=True, on_measure=say)


# The command's options that are not knobs: the model's shape, the workload, the calibration.
RUN_OPTIONS = dict(dataset_tokens=None, examples=None, epochs=1.0, price_per_kwh=None, no_calibration=False,
                   params=None, layers=None, hidden=None, heads=None, vocab=32000)


def estimate(model: str | None = None, *, hardware: str | None = None, setup: TrainingSetup | None = None,
             **options):
    """Library twin of the command: returns (MemoryEstimate, the setup estimated, the nearest fitting
    setup or None).

    `setup` is estimated as it is. Without it, knob keywords (trainfit.core.knobs names such as
    micro_batch=4, method="lora", fsdp_no_sync=True; the flags' spellings zero=3, gpus=2 too) build
    it through the knob table, as the command does. Other keywords: RUN_OPTIONS.
    """
    opts, spec, hw, setup = _library_inputs(model, hardware, setup, options)
    result, suggestion = _memory(opts, spec, hw, setup)
    return result, setup, suggestion


def estimate_run(model: str | None = None, *, hardware: str | None = None, setup: TrainingSetup | None = None,
                 **options):
    """Library twin of the whole command: (MemoryEstimate, the setup asked, the nearest fitting setup
    or None, the RunPrediction printed: speed, power, run time of what would run)."""
    opts, spec, hw, setup = _library_inputs(model, hardware, setup, options)
    result, suggestion = _memory(opts, spec, hw, setup)
    runs = suggestion if suggestion is not None else setup
    return result, setup, suggestion, _run_prediction(opts, spec, hw, runs) if hw is not None else None


def _library_inputs(model: str | None, hardware: str | None, setup: TrainingSetup | None, options: dict):
    """(run options, model, hardware, setup) from a library call: no command line parsed."""
    from trainfit.core.knobs import KNOBS

    by_dest = {k.dest: k.name for k in KNOBS}
    knobs, run_options = {}, dict(RUN_OPTIONS)
    for key, value in options.items():
        if key in run_options:
            run_options[key] = value
        elif key in by_dest or key in by_dest.values():
            knobs[by_dest.get(key, key)] = value
        else:
            raise BadInputError(f"estimate(): unknown option {key!r}")
    if setup is not None and knobs:
        raise BadInputError(f"estimate(): give a setup or knobs ({', '.join(knobs)}), not both")
    opts = argparse.Namespace(model=model, hardware=hardware, **run_options)
    spec = _model(opts)
    hw = load_hardware(hardware)
    if setup is None:
        setup = setup_from_knobs(with_installed_versions(knobs, hardware), hw, spec)
    return opts, spec, hw, setup


def _inputs(args: argparse.Namespace):
    spec = _model(args)
    hw = load_hardware(args.hardware)
    return spec, hw, apply_to(args, build_setup(args, hw, spec), this_machine=args.hardware is None)


def _memory(args: argparse.Namespace, spec, hw, setup: TrainingSetup):
    from trainfit.core.memory import estimate_memory
    from trainfit.core.plan.nearest import nearest_fitting
    from trainfit.core.memory.calibrated import apply_memory_factor

    result = estimate_memory(spec, setup, hw)
    calibration = _machine_calibration(args, hw, setup)
    if calibration is not None and calibration.memory_factor:
        prefix = "cuda" if setup.device in ("cuda", "rocm") else setup.device
        result = apply_memory_factor(result, prefix, calibration.memory_factor, calibration_source(calibration))
    over_host = host_ram(result, setup, hw)[2] if hw is not None else False
    framework = args.framework_applied.framework if hasattr(args, "framework_applied") else None
    suggestion = nearest_fitting(spec, setup, hw, framework) if result.fits is False or over_host else None
    return result, suggestion


def host_ram(result, setup: TrainingSetup, hw) -> tuple[int | None, int | None, bool]:
    """(host RAM the setting holds, the host's usable RAM, whether it is over): the check plan and
    cloud make (core.plan.host_ram); (None, None, False) where the RAM is the device itself."""
    from trainfit.core.plan.host_ram import host_ram_need_bytes, ram_is_the_device

    if hw is None or ram_is_the_device(setup, hw):
        return None, None, False
    need, usable = host_ram_need_bytes(result, setup, hw), hw.memory.usable_bytes
    return need, usable, usable is not None and need > usable


def _machine_calibration(args: argparse.Namespace, hw, setup: TrainingSetup):
    return machine_calibration(hw, setup.device, named_hardware=args.hardware, disabled=args.no_calibration)


def machine_calibration(hw, device: str, *, named_hardware: str | None, disabled: bool = False):
    """This machine's `trainfit verify` ratios for the device, or None.

    A catalog machine ('rtx-4090') is not this machine; the live profile and a saved profile
    JSON of it are (the calibration is keyed by the machine fingerprint).
    """
    if disabled or hw is None or (named_hardware and not hw.source.startswith("file:")):
        return None
    from trainfit.train.calibration import device_key, load_calibration, machine_fingerprint

    calibration = load_calibration(machine_fingerprint(hw))
    if calibration is None:
        return None
    return calibration.devices.get(device_key(device, hw.gpus[0].name if hw.gpus else None))


def calibration_source(device_calibration) -> str:
    n = device_calibration.samples
    return f"trainfit verify on this machine ({n} run{'s' if n != 1 else ''})"


def _run_prediction(args: argparse.Namespace, spec, hw, setup: TrainingSetup):
    """Step time, power and (with a dataset size) run time, energy and electricity cost."""
    from trainfit.core.run.power import DEFAULT_PRICE_PER_KWH
    from trainfit.core.run.prediction import predict_run
    from trainfit.core.speed import Workload

    if args.dataset_tokens is not None and args.examples is not None:
        raise BadInputError("give either --dataset-tokens or --examples, not both")
    for flag, value in (("--dataset-tokens", args.dataset_tokens), ("--examples", args.examples)):
        if value is not None and value <= 0:
            raise BadInputError(f"{flag} must be a positive integer, got {value}")
    if not 0 < args.epochs <= 1000:
        raise BadInputError(f"--epochs must be in (0, 1000], got {args.epochs}")
    price = DEFAULT_PRICE_PER_KWH if args.price_per_kwh is None else args.price_per_kwh
    if price < 0:
        raise BadInputError(f"--price-per-kwh must not be negative, got {price}")
    workload = None
    if args.examples:  # rows of a length distribution, sized as plan and cloud size them
        from trainfit.core.plan.lengths import examples_workload

        workload = examples_workload(setup, args.examples, args.epochs)
    elif args.dataset_tokens:
        workload = Workload(dataset_tokens=args.dataset_tokens, epochs=args.epochs)
    calibration = _machine_calibration(args, hw, setup)
    factor = calibration.step_time_factor if calibration and calibration.step_time_factor else 1.0
    return predict_run(spec, setup, hw, workload, price_per_kwh=price, step_time_factor=factor,
                       calibration_source=calibration_source(calibration) if calibration else "")


def run(args: argparse.Namespace) -> int:
    from trainfit.core.plan.nearest import describe_changes

    spec, hw, setup = _inputs(args)
    result, suggestion = _memory(args, spec, hw, setup)
    # Speed and run time of what would run: the asked setting, or the nearest one that fits.
    runs = suggestion if suggestion is not None else setup
    run_pred = _run_prediction(args, spec, hw, runs) if hw is not None else None
    changes = describe_changes(setup, suggestion) if suggestion is not None else []
    host_need, host_usable, over_host = host_ram(result, setup, hw)
    fits = False if over_host else result.fits
    rates = None
    if run_pred is not None:  # which speed rates the prediction used and when they were measured
        from trainfit.core.speed.rates import rates_source

        rates = rates_source(hw, runs.device)
    if args.json:
        from trainfit.cli.output import device_memory_json, print_json
        from trainfit.core.serde import to_jsonable

        doc = to_jsonable(result)
        doc["fits"] = fits
        doc["host_ram_bytes"], doc["host_ram_usable_bytes"] = host_need, host_usable
        doc["devices"] = [device_memory_json(dev) for dev in result.devices]
        doc["setup"] = to_jsonable(setup)
        doc["nearest_fitting"] = None if suggestion is None else {"setup": to_jsonable(suggestion), "changes": changes}
        doc["run"] = None if run_pred is None else to_jsonable(run_pred)
        doc["run_setting"] = "nearest_fitting" if suggestion is not None else "asked"
        doc["rates"] = rates
        doc["units"] = {"*_bytes": "bytes", "*_seconds": "seconds", "*_watts": "watts", "energy_kwh": "kWh"}
        doc["framework"] = framework_report(args, spec, hw, as_json=True)
        print_json(doc)
    else:
        _render(result, setup, changes, suggestion is not None, host=(host_need, host_usable, over_host))
        if run_pred is not None:
            _render_run(run_pred, "the nearest setting that fits" if suggestion is not None else "",
                        inference=setup.method == "inference")
            _render_rates(rates)
        framework_report(args, spec, hw, as_json=False)
    return EXIT_DOES_NOT_FIT if fits is False else EXIT_OK


def framework_report(args: argparse.Namespace, spec, hw, *, as_json: bool):
    """Which framework the figures are for and what each of its behaviours adds (printed, or the JSON)."""
    from trainfit.cli.framework_arg import effects, framework_json, framework_lines, needed_bytes_fn

    applied = args.framework_applied
    found = effects(applied, needed_bytes_fn(spec, hw))
    if as_json:
        return framework_json(applied, found)
    from trainfit.cli.output import console

    for line in framework_lines(applied, found):
        console().print(line, markup=False, highlight=False)
    return None


def _render_rates(rates: dict | None) -> None:
    from trainfit.cli.output import console

    if rates:
        console().print(f"rates: {rates['text']}")
        if rates["warning"]:
            console().print(f"[yellow]⚠[/] {rates['warning']}")


def _render_run(pred, of: str = "", *, inference: bool = False) -> None:
    from trainfit.cli.output import console

    out = console()
    sp, pw = pred.speed, pred.power
    from trainfit.core.durations import duration_text

    per = "per batch" if inference else "per optimizer step"
    out.print(f"speed{' of ' + of if of else ''} ({sp.device}): {duration_text(sp.step_seconds)} {per}, {sp.tokens_per_second:,.0f} tokens/s, "
              f"{sp.samples_per_second:.3g} samples/s; bottleneck: {sp.bottleneck}; MFU {sp.mfu:.0%}")
    draw = f"power: about {pw.total_watts:.0f} W"
    if pw.gpu_count:
        draw += f" ({pw.gpu_count} x {pw.gpu_watts_each:.0f} W GPU + {pw.cpu_watts:.0f} W CPU)"
    else:
        draw += f" (CPU package {pw.cpu_watts:.0f} W)"
    out.print(draw + "; rest of the system not counted")
    if sp.total_seconds is not None:
        out.print(f"run: {sp.total_steps:,} steps, {duration_text(sp.total_seconds)}, {pw.energy_kwh:.2f} kWh, "
                  f"electricity {pw.electricity_cost:.2f} at {pw.price_per_kwh:.2f}/kWh")
    else:
        out.print("run time and energy: give --dataset-tokens N or --examples N")
    for note in [*pred.notes, *pw.notes]:
        out.print(f"note: {note}")


def _render(result, setup: TrainingSetup, changes: list[str], has_fix: bool, *,
            host: tuple = (None, None, False)) -> None:
    from rich.table import Table

    from trainfit.cli.output import console

    out = console()
    out.print(f"[bold]{result.model_id}[/]  {result.params_total:,} params, {result.params_trainable:,} trainable  "
              f"({setup.method}, {setup.precision}, {setup.optimizer}, micro-batch {setup.micro_batch} x seq "
              f"{setup.seq_len}, {setup.num_gpus} x {setup.device}{_sharding_text(setup)})")
    for dev in result.devices:
        table = Table(title=f"{dev.device} memory (GiB = 2^30 bytes)", title_justify="left")
        table.add_column("component")
        table.add_column("GiB", justify="right")
        table.add_column("what")
        for c in dev.components:
            table.add_row(c.name + ("" if c.in_tensor_peak else " (margin)"), f"{c.bytes / GIB:.2f}", c.what)
        table.add_row("[bold]tensor peak[/]", f"{dev.tensor_peak_bytes / GIB:.2f}", "what max_memory_allocated sees")
        table.add_row("[bold]total[/]", f"{dev.total_bytes / GIB:.2f}", "tensor peak + margins")
        if dev.reserved_peak_bytes is not None:
            table.add_row("reserved peak", f"{dev.reserved_peak_bytes / GIB:.2f}",
                          "what max_memory_reserved sees: tensor peak + the margins in the caching allocator's pool")
        if dev.device_total_bytes != dev.total_bytes:
            why = ("paged optimizer states fill what the rest leaves" if dev.spilled_bytes
                   else "the allocator frees its cache and retries at its limit")
            table.add_row("nvidia-smi", f"{dev.device_total_bytes / GIB:.2f}", f"what the card can show: {why}")
        out.print(table)
        if dev.capacity_bytes is None:
            out.print("capacity unknown: no verdict")
        else:
            out.print(_verdict_line(dev))
    need, usable, over = host
    if need is not None and usable is not None:
        what = "offloaded states" if setup.offload != "none" else "the model while it loads"
        verdict = "[red]does not fit the host[/]" if over else "fits the host"
        out.print(f"host RAM: {verdict}: needs {need / GIB:.2f} of {usable / GIB:.2f} GiB usable ({what})")
    for note in result.notes:
        out.print(f"note: {note}")
    if result.fits is False or over:
        if has_fix:
            out.print("nearest setting that fits: " + "; ".join(changes))
        else:
            out.print("nothing tried fits this hardware (see 'trainfit gpus' for larger GPUs)")


def _verdict_line(dev) -> str:
    """fits / fits under memory pressure / does not fit, with the bytes the verdict compared."""
    from trainfit.core.memory.overheads import under_pressure_text

    cap = f"{dev.capacity_bytes / GIB:.2f} GiB on {dev.device}"
    if dev.fits_under_pressure:
        return f"[yellow]fits under memory pressure[/]: needs {dev.needed_bytes / GIB:.2f} of {cap}; {under_pressure_text(dev)}"
    if dev.fits:  # the need the verdict compared, as plan and cloud show it
        return f"[green]fits[/]: needs {dev.needed_bytes / GIB:.2f} of {cap}"
    return f"[red]does not fit[/]: needs {dev.needed_bytes / GIB:.2f} of {cap}"


def _sharding_text(setup: TrainingSetup) -> str:
    """', FSDP full-shard + CPU offload, activation offload' etc.: the engine and offload knobs set."""
    parts = []
    if setup.fsdp_strategy != "none":
        parts.append(f"FSDP {setup.fsdp_strategy}" + (" + CPU offload" if setup.offload != "none" else ""))
    elif setup.zero_stage:
        parts.append(f"ZeRO-{setup.zero_stage}" + (f" + offload {setup.offload}" if setup.offload != "none" else ""))
    if setup.activation_offload:
        parts.append("activation offload")
    if setup.optimizer_in_backward:
        parts.append("optimizer in backward")
    if setup.optimizer_impl != "auto":
        parts.append(f"{setup.optimizer_impl} AdamW")
    if setup.bnb_keeps_input:
        parts.append("bitsandbytes < 0.43.2")
    if setup.logits_shift_copy:
        parts.append("transformers < 4.49 loss")
    if setup.output_kept:
        parts.append("loop keeps the output")
    if setup.previous_step_kept:
        parts.append("loop keeps the previous step")
    if setup.model_code != "transformers":
        parts.append(f"{setup.model_code} model code")
    if setup.fsdp_mixed_units:
        parts.append("adapters in their layer's FSDP unit")
    if setup.kbit_upcast:
        parts.append("PEFT fp32 upcast")
    if setup.autocast_16bit_weights:
        parts.append("autocast over 16-bit weights")
    if setup.fsdp_no_sync:
        parts.append("FSDP no_sync accumulation")
    if setup.quantize_lm_head:
        parts.append("lm_head quantised")
    if setup.bnb_fp16_quant_state:
        parts.append("fp16 quant state")
    if setup.torch_compile:
        parts.append("torch.compile")
    parts += _other_runtime_knobs(setup)
    return "".join(f", {p}" for p in parts)


_NAMED_ABOVE = ("optimizer_impl", "output_kept", "previous_step_kept", "model_code", "fsdp_mixed_units", "kbit_upcast",
                "autocast_16bit_weights", "fsdp_no_sync", "quantize_lm_head", "bnb_fp16_quant_state", "torch_compile")


def _other_runtime_knobs(setup: TrainingSetup) -> list[str]:
    """Runtime knobs set away from trainfit's own run that the header does not word yet, as KEY=VALUE."""
    from trainfit.core.knobs import RUNTIME_KNOBS

    return [f"{k.name}={getattr(setup, k.field)}" for k in RUNTIME_KNOBS
            if k.field and k.field not in _NAMED_ABOVE and getattr(setup, k.field) != k.default]
