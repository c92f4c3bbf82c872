"""`trainfit estimate`: memory of a training or inference setup, per device, with its parts.

No torch import on this path: the model comes from the catalog / config.json / a shape, the
hardware from the catalog, a profile JSON, or the quick live profile (CPU, RAM, GPUs).
"""

from __future__ import annotations

import argparse
import typing

from trainfit.core.setup import DEFAULT_METHOD, METHOD_ALIASES, METHODS, Attention, Checkpointing, Device, FsdpStrategy, \
    LoraSettings, LossKernel, ModelCode, Offload, Optimizer, OptimizerImpl, PrecisionMode, Quant, TrainingSetup, parse_method
from trainfit.cli.framework_arg import add_framework_argument, apply_to
from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError
from trainfit.validate import arg

HELP = "predict the memory of a training / inference setup and say whether it fits"
GIB = 1 << 30


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    """--image-size / --images-per-example, the same flags and checks in estimate and plan."""
    p.add_argument("--image-size", type=arg("image_size"), default=None,
                   help="vision-language models: image side in pixels (Qwen2-VL: (side/28)^2 tokens); "
                   "default: the model's default resolution")
    p.add_argument("--images-per-example", type=arg("images_per_example"), default=None,
                   help="vision-language models: images per example, their tokens added to each sequence "
                   "(default 1 with --image-size, else 0)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="catalog id or alias, a local model dir or config.json, a shape "
                   "('shape:125m'), or a Hugging Face Hub id 'owner/name[@revision]' (config.json and safetensors "
                   "headers only; the lookup gives up after TRAINFIT_HUB_DEADLINE seconds, default 60); omit with "
                   "--params or --layers/--hidden/--heads")
    p.add_argument("--method", choices=(*METHODS, *METHOD_ALIASES), default=DEFAULT_METHOD,
                   help=f"default {DEFAULT_METHOD} (as plan and cloud; sft = full)")
    p.add_argument("--precision", choices=typing.get_args(PrecisionMode), default=None,
                   help="default: bf16 (fp16 without bf16 support) mixed precision for full training; the "
                   "frozen base in pure 16-bit for LoRA/QLoRA/inference on GPUs; fp32 or bf16-mixed on CPU")
    p.add_argument("--optimizer", choices=typing.get_args(Optimizer), default="adamw")
    p.add_argument("--micro-batch", type=arg("micro_batch"), default=1)
    p.add_argument("--seq-len", type=arg("seq_len"), default=512)
    p.add_argument("--grad-accum", type=arg("grad_accum"), default=1)
    p.add_argument("--grad-checkpointing", choices=typing.get_args(Checkpointing), default="none")
    p.add_argument("--lora-r", type=arg("lora_rank"), default=None, help="LoRA rank (default 16)")
    p.add_argument("--lora-alpha", type=arg("lora_alpha"), default=None, help="LoRA alpha (default 2 x rank)")
    p.add_argument("--lora-dropout", type=arg("lora_dropout"), default=None,
                   help="LoRA dropout (default 0.05)")
    p.add_argument("--lora-targets", default=None, help="q_proj,v_proj or all-linear (default: every linear layer "
                   "of the blocks, not lm_head, as plan and cloud)")
    p.add_argument("--quant", choices=typing.get_args(Quant), default=None)
    p.add_argument("--zero", type=arg("zero_stage"), default=None,
                   help="DeepSpeed ZeRO stage 0-3 (default 0; with --fsdp its equivalent stage)")
    p.add_argument("--fsdp", choices=[s for s in typing.get_args(FsdpStrategy) if s != "none"], default=None,
                   help="PyTorch FSDP instead of DeepSpeed: full-shard (ZeRO-3-like), shard-grad-op (ZeRO-2-like) "
                   "or no-shard (DDP-like); CPU offload with --offload optimizer+params")
    p.add_argument("--offload", choices=typing.get_args(Offload), default="none",
                   help="CPU offload: DeepSpeed ZeRO-Offload (--zero >= 1; optimizer+params needs --zero 3) or "
                   "FSDP CPU offload (--fsdp full-shard --offload optimizer+params)")
    p.add_argument("--activation-offload", action="store_true",
                   help="move saved activations to pinned CPU memory (TRL/torchtune activation offloading)")
    p.add_argument("--optimizer-in-backward", action="store_true",
                   help="step each parameter during backward and free its gradient (torchtune optimizer_in_bwd; "
                   "needs --grad-accum 1, no gradient clipping)")
    p.add_argument("--gpus", type=arg("num_gpus"), default=None, help="GPUs (default: all of the hardware's)")
    p.add_argument("--attn", choices=typing.get_args(Attention), default="sdpa")
    p.add_argument("--generate", type=arg("generate_tokens"), default=0, help="inference: tokens generated after the prompt")
    p.add_argument("--dpo-reference", choices=("separate", "lora-base", "precomputed"), default=None)
    p.add_argument("--device", choices=typing.get_args(Device), default=None,
                   help="default: the hardware's accelerator")
    p.add_argument("--dataset-tokens", type=arg("dataset_tokens"), default=None,
                   help="tokens in the training set: adds run time, energy and electricity cost")
    p.add_argument("--examples", type=arg("examples"), default=None, help="training examples, at the task's typical length (data/typical_lengths.yaml), as plan sizes them")
    p.add_argument("--epochs", type=arg("epochs"), default=1.0)
    p.add_argument("--price-per-kwh", type=arg("price_per_kwh"), default=None,
                   help="electricity price per kWh (default 0.17, the 2024 U.S. residential average)")
    p.add_argument("--no-calibration", action="store_true",
                   help="ignore the measured/predicted ratio that `trainfit verify` stored for this machine")
    p.add_argument("--hardware", default=None, help="catalog machine ('rtx-4090', '2x a100-80gb', 't4', "
                   "'m2-16gb', 'cpu') or a profile JSON; default: this machine")
    p.add_argument("--params", default=None, help="pretraining shape by size, e.g. 125m, 1.3b")
    p.add_argument("--layers", type=arg("layers"))
    p.add_argument("--hidden", type=arg("hidden"))
    p.add_argument("--heads", type=arg("heads"))
    p.add_argument("--vocab", type=arg("vocab"), default=32000)
    p.add_argument("--loss", choices=typing.get_args(LossKernel), default="standard",
                   help="cross-entropy: standard (whole logits, fp32 upcast), chunked (torchtune's "
                   "CEWithChunkedOutputLoss: 8 pieces upcast one at a time), "
                   "fused (Liger-Kernel fused linear cross-entropy: one chunk of logits at a time) or "
                   "chunked-16bit (LitGPT: lm_head and loss in 128-token chunks, no fp32 upcast)")
    p.add_argument("--optimizer-impl", choices=typing.get_args(OptimizerImpl), default="auto",
                   help="how torch's AdamW steps: auto (what trainfit runs: fused on a GPU), fused, foreach "
                   "(torch's default on CUDA when a script asks for neither: one more moment-sized temporary "
                   "at the step) or for-loop")
    p.add_argument("--bitsandbytes-version", default=None, metavar="VERSION",
                   help="bitsandbytes of the run (default: a current release); before 0.43.2 every 4-bit "
                   "layer keeps its input for backward")
    p.add_argument("--transformers-version", default=None, metavar="VERSION",
                   help="transformers of the run (default: the installed one without --hardware, else a current "
                   "release); before 4.49 the causal-LM loss copies the shifted logits, and some architectures "
                   "(gpt_bigcode, falcon, bloom, gpt_neox, opt, mpt, dbrx) compute it on 16-bit logits; from 5.0 "
                   "MoE experts are fused 3-D parameters, which bitsandbytes leaves 16-bit")
    p.add_argument("--output-kept", action="store_true",
                   help="the training loop keeps the model output through backward and the step "
                   "(`outputs = model(**batch); outputs.loss.backward()`): its logits stay alive; the HF Trainer "
                   "and trainfit's runs drop it before backward")
    p.add_argument("--previous-step-kept", action="store_true",
                   help="the training loop's names hold the previous micro-step's logits and loss until the next "
                   "forward returns (LitGPT's finetune scripts): its logits, and the inputs bitsandbytes < 0.43.2 "
                   "keeps, stay alive through that forward")
    p.add_argument("--fsdp-mixed-units", action="store_true",
                   help="FSDP LoRA with the adapters inside their frozen layer's wrapped unit (e.g. LitGPT): "
                   "gradients kept for the whole unit")
    p.add_argument("--fsdp-no-sync", action="store_true",
                   help="FSDP accumulating micro-batches under no_sync (the HF Trainer's default, Lightning "
                   "Fabric): every unit's unsharded gradient kept until the last micro-batch; trainfit's own "
                   "runs reduce-scatter after each one")
    p.add_argument("--kbit-upcast", action="store_true",
                   help="QLoRA prepared by PEFT's prepare_model_for_kbit_training (TRL's SFTTrainer does it): "
                   "embeddings, norms and lm_head cast to fp32; trainfit's own runs keep them 16-bit")
    p.add_argument("--autocast-16bit-weights", action="store_true",
                   help="a 16-bit model run under autocast (torch_dtype=bfloat16 with --bf16, the usual Transformers "
                   "QLoRA recipe): LayerNorm models with 4-bit linears carry an fp32 residual stream; trainfit's "
                   "own --precision bf16 runs without autocast")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="QLoRA / int8 with the output layer quantised too (Lightning Fabric's bitsandbytes plugin, "
                   "LitGPT --quantize bnb.*); Transformers and trainfit's runs keep the lm_head 16-bit")
    p.add_argument("--bnb-fp16-quant-state", action="store_true",
                   help="4-bit weights quantised from an fp16 copy (Lightning Fabric's bitsandbytes plugin): with "
                   "bf16 compute each de-quantised weight is cast again, two copies alive at once")
    p.add_argument("--torch-compile", action="store_true",
                   help="the model run under torch.compile (torchtune's compile=True, TrainingArguments."
                   "torch_compile): elementwise ops fused, fewer kernels; memory counted as eager (an upper "
                   "bound), except the loss (standard or chunked), whose compiled graph keeps the 16-bit logits "
                   "instead of an fp32 log_softmax; trainfit's own runs are eager")
    p.add_argument("--model-code", choices=typing.get_args(ModelCode), default="transformers",
                   help="whose modeling code runs the model: transformers with PEFT's LoRA (trainfit's runs) or "
                   "LitGPT's own GPT and LoRA layers, which keep different activations")
    p.add_argument("--dora", action="store_true", help="DoRA (PEFT use_dora): LoRA + a trained magnitude per "
                   "output feature; with --method lora/qlora")
    add_image_arguments(p)
    add_framework_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _model(args: argparse.Namespace):
    from trainfit.core import model_shapes
    from trainfit.core.model_catalog import resolve_model

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


def _lora(args: argparse.Namespace, spec=None) -> LoraSettings:
    """The LoRA flags over the one default (core.plan.space.default_lora: rank 16 on every linear
    layer of the blocks), the adapters plan and cloud plan."""
    from trainfit.core.plan.space import default_lora

    rank = 16 if args.lora_r is None else args.lora_r
    targets: list[str] | str = (default_lora(spec).target_modules if spec is not None
                                else ["q_proj", "k_proj", "v_proj", "o_proj"])
    if args.lora_targets:
        t = args.lora_targets.strip()
        targets = "all-linear" if t == "all-linear" else [x.strip() for x in t.split(",") if x.strip()]
        if not targets:
            raise BadInputError(f"--lora-targets: {args.lora_targets!r} names no module",
                                hint="give names such as q_proj,v_proj, or all-linear")
    dropout = 0.05 if args.lora_dropout is None else args.lora_dropout
    return LoraSettings(rank=rank, alpha=args.lora_alpha or 2 * rank, dropout=dropout,
                        target_modules=targets)  # type: ignore[arg-type]


def build_setup(args: argparse.Namespace, hardware, spec=None) -> TrainingSetup:
    """The command's flags as an intent; core.plan.intent fills in the rest for the hardware."""
    from trainfit.core.plan.intent import resolve_setup

    method = parse_method(args.method)
    wants_lora = any(v is not None for v in (args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets))
    if method == "full" and args.method == "sft" and wants_lora:
        method = "lora"  # "SFT with LoRA flags" is LoRA training on instruction data
    elif wants_lora and method in ("full", "pretrain", "inference"):
        raise BadInputError(f"--lora-r/--lora-alpha/--lora-dropout/--lora-targets apply to LoRA training, "
                            f"not --method {args.method}", hint="use --method lora, qlora or dpo, or drop them")
    lora = _lora(args, spec) if (method in ("lora", "qlora") or (method == "dpo" and wants_lora)) else None
    gpus = args.gpus
    on_gpus = hardware is not None and hardware.gpu_count > 0 and args.device != "cpu"
    if gpus is not None and on_gpus and gpus > hardware.gpu_count:
        raise BadInputError(f"--gpus {gpus}: the hardware has {hardware.gpu_count} GPU(s)",
                            hint=f"use --gpus 1..{hardware.gpu_count}, or name more in --hardware (e.g. '{gpus}x ...')")
    if args.device == "cpu" or (args.device is None and hardware is not None and hardware.accelerator == "cpu"):
        gpus = args.gpus or 1
    return resolve_setup(hardware, method, lora=lora, precision=args.precision, device=args.device, num_gpus=gpus,
                         quant=args.quant, dpo_reference=args.dpo_reference, optimizer=args.optimizer,
                         micro_batch=args.micro_batch, seq_len=args.seq_len, grad_accum=args.grad_accum,
                         grad_checkpointing=args.grad_checkpointing, attention=args.attn,
                         generate_tokens=args.generate, **_sharding_knobs(args), **_model_knobs(args))


def _sharding_knobs(args: argparse.Namespace) -> dict:
    """--zero / --fsdp / --offload / --activation-offload / --optimizer-in-backward as setup fields.
    --fsdp implies its ZeRO-equivalent stage; a different explicit --zero is refused by the memory
    model's checks (trainfit.core.memory.knob_checks) with the fix."""
    from trainfit.core.memory.fsdp import FSDP_EQUIVALENT_STAGE

    fsdp = args.fsdp or "none"
    zero = args.zero if args.zero is not None else FSDP_EQUIVALENT_STAGE.get(fsdp, 0)
    return dict(zero_stage=zero, fsdp_strategy=fsdp, offload=args.offload,
                activation_offload=bool(args.activation_offload),
                optimizer_in_backward=bool(args.optimizer_in_backward))


def _model_knobs(args: argparse.Namespace) -> dict:
    """--loss / --dora / --image-size / --images-per-example as setup fields (checked against the model
    by trainfit.core.memory.model_knob_checks). An image size alone means one image per example."""
    images = args.images_per_example
    if images is None:
        images = 1 if args.image_size else 0
    return dict(loss=args.loss, dora=bool(args.dora), image_size=args.image_size or 0, images_per_example=images,
                **_framework_knobs(args))


def _framework_knobs(args: argparse.Namespace) -> dict:
    """--optimizer-impl / --bitsandbytes-version / --transformers-version / --output-kept / --fsdp-mixed-units /
    --kbit-upcast / --autocast-16bit-weights / --fsdp-no-sync / --quantize-lm-head / --bnb-fp16-quant-state / --model-code /
    --previous-step-kept / --torch-compile as setup fields
    (trainfit.core.memory.framework_effects). Without --hardware a run on this machine uses the
    installed bitsandbytes and transformers, so their versions are the defaults there."""
    from trainfit.core.memory.framework_effects import BNB_QUANTS, bnb_keeps_input_for, transformers_knobs
    from trainfit.export.versions import installed_version

    version = args.bitsandbytes_version
    quant = args.quant or ("nf4" if args.method == "qlora" else None)
    if version is None and args.hardware is None and quant in BNB_QUANTS:
        version = installed_version("bitsandbytes")
    tf_version = args.transformers_version
    if tf_version is None and args.hardware is None:
        tf_version = installed_version("transformers")
    keeps = _from_version("--bitsandbytes-version", version, bnb_keeps_input_for, False)
    tf_knobs = _from_version("--transformers-version", tf_version, transformers_knobs, {})
    return dict(optimizer_impl=args.optimizer_impl, bnb_keeps_input=keeps, **tf_knobs,
                output_kept=bool(args.output_kept), fsdp_mixed_units=bool(args.fsdp_mixed_units), kbit_upcast=bool(args.kbit_upcast),
                autocast_16bit_weights=bool(args.autocast_16bit_weights),
                fsdp_no_sync=bool(args.fsdp_no_sync), quantize_lm_head=bool(args.quantize_lm_head),
                bnb_fp16_quant_state=bool(args.bnb_fp16_quant_state), model_code=args.model_code,
                previous_step_kept=bool(args.previous_step_kept), torch_compile=bool(args.torch_compile))


def _from_version(flag: str, version: str | None, parse, default):
    """`parse(version)`, or `default` when no version is known; a malformed one is the user's error."""
    if version is None:
        return default
    try:
        return parse(version)
    except ValueError as e:
        raise BadInputError(f"{flag}: {e}") from None


def load_hardware(spec: str | None):
    """A catalog machine or profile JSON when named, else the quick live profile ('' is an
    error, not this machine)."""
    if spec is not None:
        from trainfit.core.hardware_spec import resolve_hardware

        return resolve_hardware(spec)
    from trainfit.cli.output import say
    from trainfit.hardware.profiler import build_profile

    return build_profile(quick=True, on_measure=say)


def estimate(model: str | None = None, *, hardware: str | None = None, **flags):
    """Python twin of the command: returns (MemoryEstimate, suggested TrainingSetup | None).

    Keyword flags are the command's long options with underscores (micro_batch=4, method="lora").
    """
    return _estimate(_twin_args(model, hardware, flags))


def estimate_run(model: str | None = None, *, hardware: str | None = None, **flags):
    """Python twin of the whole command: (MemoryEstimate, the setup asked, the nearest fitting setup
    or None, the RunPrediction printed: speed, power, run time of what would run)."""
    args = _twin_args(model, hardware, flags)
    spec, hw, setup = _inputs(args)
    result, suggestion = _memory(args, spec, hw, setup)
    runs = suggestion if suggestion is not None else setup
    return result, setup, suggestion, _run_prediction(args, spec, hw, runs) if hw is not None else None


def _twin_args(model: str | None, hardware: str | None, flags: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([] if model is None else [model])
    for key, value in flags.items():
        if not hasattr(args, key):
            raise BadInputError(f"estimate(): unknown option {key!r}")
        setattr(args, key, value)
    args.hardware = hardware
    return args


def _inputs(args: argparse.Namespace):
    spec = _model(args)
    hw = load_hardware(args.hardware)
    return spec, hw, apply_to(args, build_setup(args, hw, spec), this_machine=args.hardware is None)


def _estimate(args: argparse.Namespace):
    spec, hw, setup = _inputs(args)
    result, suggestion = _memory(args, spec, hw, setup)
    return result, setup, suggestion


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
    from trainfit.core.power import DEFAULT_PRICE_PER_KWH
    from trainfit.core.run_prediction import predict_run
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
    return "".join(f", {p}" for p in parts)
