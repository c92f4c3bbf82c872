"""The planner: three configurations per goal (conservative, balanced, extreme), each the best
setting the engine finds under the mode's targets, with its estimate, reasons and warnings.

Goals: fine-tune a given model (full / LoRA / QLoRA, SFT or DPO), pretrain from scratch (the
planner picks the size: the largest shape whose Chinchilla budget, C ~ 6 N D with D = the mode's
tokens per parameter x N, trains within the mode's time), and inference capacity (the largest
batch x context). Deterministic; no trial runs: memory and speed come from the models that the
benchmarks under bench/ check against measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainfit.core.memory.overheads import under_pressure_text
from trainfit.core.memory.quant_formats import dense_experts_text, experts_left_dense
from trainfit.core.memory.stats import model_stats
from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.model_spec import ModelSpec
from trainfit.core.plan import data_io, lengths, measured, space, variants
from trainfit.core.plan.data_io import DataPlan, DatasetInfo
from trainfit.core.plan.engine import Budget, Candidate, SearchResult, Tier, search
from trainfit.core.plan.hardware_rules import DeviceRules, power_cap_hint, rules_for
from trainfit.core.plan.modes import DEFAULTS, MODES, SEQ_FLOOR, ModeTargets, shorter_seq_lens, targets
from trainfit.core.plan import multinode
from trainfit.core.durations import hours_text
from trainfit.core.power import DEFAULT_PRICE_PER_KWH, PowerEstimate
from trainfit.core.profile import HardwareProfile
from trainfit.core.setup import METHODS, LoraSettings, TrainingSetup
from trainfit.core.speed.types import SpeedEstimate, Workload
from trainfit.errors import BadInputError, UnavailableError

if TYPE_CHECKING:  # names only: the spot model and the cloud catalog load with `plan --flavor ID --spot` alone
    from trainfit.core.cloud_catalog import SpotTerms
    from trainfit.core.spot import SpotEstimate

GIB = 1 << 30
# Pretraining sizes the planner tries (parameters), smallest first.
PRETRAIN_LADDER = (1_000_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 15_000_000, 23_000_000, 35_000_000, 50_000_000, 70_000_000,
                   100_000_000, 125_000_000, 160_000_000, 200_000_000, 350_000_000, 500_000_000, 760_000_000,
                   1_000_000_000, 1_500_000_000, 3_000_000_000, 7_000_000_000, 13_000_000_000)
PLAN_METHODS = ("auto", *METHODS)  # auto: full fine-tuning, falling back to LoRA, then QLoRA



@dataclass(frozen=True)
class PlanRequest:
    hardware: HardwareProfile
    method: str = "auto"  # PLAN_METHODS
    model: ModelSpec | None = None  # None with pretrain: the planner picks the shape
    seq_len: int | None = None  # None: the mode's range
    target_batch: int | None = None  # effective (global) batch to keep; None: the mode's default
    dataset_tokens: int | None = None
    examples: int | None = None
    epochs: float = 1.0
    time_budget_hours: float | None = None  # overrides every mode's hours_max
    memory_budget_bytes: int | None = None  # overrides the device capacity (modes take their share)
    memory_share: float | None = None  # overrides every mode's share
    tokens_per_param: float | None = None
    usd_per_hour: float | None = None  # rented machines: hourly price -> run cost
    budget_usd: float | None = None
    # `plan --flavor ID --spot`: the flavor's spot price and interruption figure (cloud_catalog.SpotTerms);
    # usd_per_hour is then the spot price, and each mode gets the expected cost with re-done work.
    spot: SpotTerms | None = None
    price_per_kwh: float = DEFAULT_PRICE_PER_KWH
    vocab_size: int = 32000  # pretraining shapes
    lora: LoraSettings | None = None  # default: rank 16 on every linear layer of the blocks
    modes: tuple[str, ...] = MODES
    # This machine's `trainfit verify` ratios (measured / predicted), as estimate applies them.
    memory_factor: float = 1.0
    step_time_factor: float = 1.0
    calibration_source: str = ""
    # The dataset as trainfit.dataset_size measured it (--data / --dataset): the data I/O plan,
    # and the workload when neither --examples nor --dataset-tokens is given.
    dataset: DatasetInfo | None = None
    # Vision-language models: image side in pixels (0: the model's default) and images per example;
    # their tokens are added to each sequence (core.memory's image model), as `estimate` counts them.
    image_size: int = 0
    images_per_example: int = 0
    # Step times measured on this machine (core.plan.measured.MeasuredStep, from `plan`'s probe):
    # they rank their settings instead of the speed model; empty: the speed model alone.
    measured_steps: tuple = ()
    measured_settle: bool = False  # the final ranking (core.plan.measured.unmeasured_factor)
    # (mode, model id, setup): picks the probe kept because nothing was measured faster by more
    # than the measurements' noise (core.plan.measured.decide); the search ranks them first.
    measured_pins: tuple = ()
    # Test hook (core.plan.measured.SpeedSkew): a speed model deliberately wrong about one knob.
    speed_skew: tuple = ()
    # The tool that will run the plan (core.frameworks.Framework, `--framework`): every candidate's memory
    # and step time are that tool's. None: trainfit's own run.
    framework: object | None = None


@dataclass(frozen=True)
class RunFigures:
    tokens: int | None  # tokens processed by the whole run (all epochs)
    steps: int | None
    hours: float | None
    energy_kwh: float | None
    electricity_cost: float | None
    rental_usd: float | None
    spot: SpotEstimate | None = None  # with PlanRequest.spot
    rental_expected_usd: float | None = None  # spot: the rental including re-done work and restarts


@dataclass(frozen=True)
class ModePlan:
    mode: str
    fits: bool
    model_id: str
    params_total: int | None
    setup: TrainingSetup | None
    memory: MemoryEstimate | None
    memory_budget_bytes: float | None  # this mode's share of the usable memory per device
    memory_used_bytes: int | None  # predicted total on the busiest device
    speed: SpeedEstimate | None
    power: PowerEstimate | None
    run: RunFigures | None
    reasons: list[str]
    warnings: list[str]
    targets: ModeTargets
    model: ModelSpec | None = None
    pretrain: dict | None = None  # params, tokens, tokens_per_param when the planner chose a size
    candidates_evaluated: int = 0
    data_io: DataPlan | None = None  # stream / cache / workers / input bottleneck / token budget (core.plan.data_io)
    # The examples' lengths at this mode's sequence length: tokens per epoch, share truncated (core.plan.lengths)
    data_lengths: lengths.DataLengths | None = None
    # Host RAM the setting holds at its peak (core.plan.host_ram), checked against Plan.host_ram_usable_bytes
    host_ram_bytes: int | None = None


@dataclass(frozen=True)
class Plan:
    method: str
    hardware: str  # profile source
    device: str  # rules label
    modes: list[ModePlan]
    notes: list[str] = field(default_factory=list)
    # The RAM of the machine planned for: this machine's, a catalog machine's typical host, or a
    # rented flavor's own (data/cloud.yaml ram_gib); None when not measured.
    host_ram_usable_bytes: int | None = None
    # Which speed rates the plan used and when they were measured (core.speed.rates.rates_source).
    rates: dict | None = None


def check_request(req: PlanRequest) -> None:
    problems = []
    if req.method not in PLAN_METHODS:
        problems.append(f"--method: {req.method!r} is not one of {', '.join(PLAN_METHODS)}")
    for m in req.modes:
        if m not in MODES:
            problems.append(f"--mode: {m!r} is not one of {', '.join(MODES)}")
    if req.model is None and req.method != "pretrain":
        problems.append("MODEL missing: give a model (catalog id, config.json) or --method pretrain")
    for flag, value in (("--seq-len", req.seq_len), ("--target-batch", req.target_batch),
                        ("--dataset-tokens", req.dataset_tokens), ("--examples", req.examples)):
        if value is not None and (isinstance(value, bool) or value < 1 or value > 10**15):
            problems.append(f"{flag} must be an integer in [1, 1e15], got {value}")
    if req.dataset_tokens is not None and req.examples is not None:
        problems.append("give either --dataset-tokens or --examples, not both")
    if not (0 < req.epochs <= 1000):
        problems.append(f"--epochs must be in (0, 1000], got {req.epochs}")
    if req.time_budget_hours is not None and not (0 < req.time_budget_hours <= 24 * 365):
        problems.append(f"--time-budget must be a positive duration up to a year, got {req.time_budget_hours} h")
    if req.memory_budget_bytes is not None and req.memory_budget_bytes < 64 * 2**20:
        problems.append(f"--memory-budget must be at least 64 MiB, got {req.memory_budget_bytes} bytes")
    if req.memory_share is not None and not (0 < req.memory_share <= 1):
        problems.append(f"--memory-share must be in (0, 1], got {req.memory_share}")
    if req.tokens_per_param is not None and not (0 < req.tokens_per_param <= 10000):
        problems.append(f"--tokens-per-param must be in (0, 10000], got {req.tokens_per_param}")
    for flag, value in (("--usd-per-hour", req.usd_per_hour), ("--budget", req.budget_usd),
                        ("--price-per-kwh", req.price_per_kwh)):
        if value is not None and (value < 0 or math.isnan(value)):
            problems.append(f"{flag} must not be negative, got {value}")
    if not (2 <= req.vocab_size <= 10_000_000):
        problems.append(f"--vocab must be in [2, 10000000], got {req.vocab_size}")
    if problems:
        raise BadInputError("; ".join(problems))
    _check_image_knobs(req)


def _check_image_knobs(req: PlanRequest) -> None:
    """--image-size / --images-per-example against the model, with estimate's checks (a refused knob
    is bad input, not a setting that "does not fit")."""
    if not (req.image_size or req.images_per_example):
        return
    if req.model is None:
        raise BadInputError("--image-size / --images-per-example: pretraining from scratch plans a text model; "
                            "give a vision-language model (e.g. qwen2-vl-2b)")
    from trainfit.core.knob_rules import check_knobs

    check_knobs(TrainingSetup(image_size=req.image_size, images_per_example=req.images_per_example), req.model)


class MemoryUnknownError(UnavailableError):
    """The profile could not read the device's memory: no memory budget to plan within."""


def plan(req: PlanRequest) -> Plan:
    """Plan every requested mode."""
    check_request(req)
    rules = rules_for(req.hardware)
    if _capacity(req, rules) is None and (req.hardware.gpus or rules.device == "cpu"):
        from trainfit.core.memory.estimate import unknown_capacity_note

        # Unknown is not unlimited: without a capacity every setting would "fit".
        raise MemoryUnknownError(f"cannot plan: {unknown_capacity_note(req.hardware, rules.device)}",
                                 hint="give the memory per device with --memory-budget (e.g. 20GiB)")
    if req.method == "qlora" and not rules.quantization:
        raise UnavailableError(f"--method qlora: {rules.reasons['quantization']}",
                               hint="plan --method lora (or auto) on this hardware")
    # --examples N is N rows of a length distribution (the data's, else the task's typical one)
    req = dataclasses.replace(req, dataset=lengths.with_lengths(req.dataset, req.method, req.examples))
    modes = []
    for name in req.modes:
        t = targets(name, memory_share=req.memory_share, tokens_per_param=req.tokens_per_param,
                    hours_max=req.time_budget_hours)
        if req.method == "pretrain" and req.model is None:
            modes.append(_plan_pretrain(req, t, rules))
        else:
            modes.append(_plan_model(req, t, rules, req.model))  # type: ignore[arg-type]
    notes = [f"memory budget: {req.memory_budget_bytes / GIB:.2f} GiB per device imposed (--memory-budget)"] \
        if req.memory_budget_bytes else []
    from trainfit.core.speed.rates import rates_source

    rates = rates_source(req.hardware, rules.device)
    if rates["warning"]:
        notes.append(rates["warning"])
    return Plan(req.method, req.hardware.source, rules.label, modes, notes, req.hardware.memory.usable_bytes, rates)


# ---------------------------------------------------------------------------------------------
# the search space of one mode
def _tier(label: str, base: TrainingSetup, rules: DeviceRules, t: ModeTargets, global_batch: int, *,
          offload: bool) -> Tier:
    inference = base.method == "inference"
    precisions = [base.precision]
    if rules.device == "cpu" and base.precision in ("fp32", "bf16-mixed"):
        # Both on every CPU: bf16 is emulated on most, and where it has instructions (AVX512-BF16,
        # AMX) autocast's casts can still cost more than they save on a small model. The speed
        # model ranks them; on this machine the plan's probe checks it.
        precisions.append("bf16-mixed" if base.precision == "fp32" else "fp32")
    optimizers = ["adamw"]
    if "adamw-8bit" in rules.optimizers and base.lora is None and not inference:
        optimizers.append("adamw-8bit")
    zeros, offloads = [0], ["none"]
    if rules.max_zero_stage and not inference:
        zeros = [0, 1, 2, 3] if base.lora is None else [0, 2]
    if offload:
        zeros, offloads = [2, 3], ["optimizer", "optimizer+params"]
    # Eager attention only ever loses on GPUs (more memory, no faster); CPUs get both kernels.
    attention = rules.attention if rules.device == "cpu" else tuple(a for a in rules.attention if a != "eager")
    bases = space.product(base, precision=precisions, optimizer=optimizers,
                          grad_checkpointing=("none",) if inference else ("none", "full"),
                          attention=attention or rules.attention, zero_stage=zeros, offload=offloads,
                          hybrid_shard=multinode.hybrid_options(base))
    if inference:
        batches = [b for b in space.POWERS_OF_TWO if b <= max(t.micro_batch_max, 1) * 2]
        return Tier(label, [[dataclasses.replace(b, micro_batch=mb) for mb in batches] for b in bases])
    batches = space.micro_batches(global_batch, base.num_gpus, high=t.micro_batch_max)
    return Tier(label, space.batch_chains(bases, batches, global_batch))


def _seq_lens(req: PlanRequest, t: ModeTargets, model: ModelSpec) -> list[int]:
    if req.seq_len is not None:
        return [req.seq_len]
    fitting = [s for s in t.seq_lens if s <= model.max_position_embeddings]
    return fitting or [model.max_position_embeddings]


def _base(req: PlanRequest, variant: str, rules: DeviceRules, seq: int, lora: LoraSettings) -> TrainingSetup:
    """The variant's base setup with the request's image knobs (vision-language models)."""
    base = variants.base_setup(variant, req.hardware, rules, seq_len=seq, lora=lora)
    if req.image_size or req.images_per_example:
        base = dataclasses.replace(base, image_size=req.image_size, images_per_example=req.images_per_example)
    return base


def _tiers(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec, global_batch: int) -> list[Tier]:
    """The mode's sequence lengths for every method variant (the user's method first), then, when the
    user gave no --seq-len, shorter sequences down to SEQ_FLOOR: a shorter context is given up only
    after every method has failed at the mode's own lengths."""
    lora = req.lora or space.default_lora(model)
    chain = [v for v in variants.chain(req.method)
             if not (variants.needs_bitsandbytes(v) and not rules.quantization)]
    seqs = _seq_lens(req, t, model)
    tiers = []
    for variant in chain:
        tiers += _variant_tiers(req, t, rules, global_batch, variant, seqs, lora,
                                tag=lambda seq: f" at {seq} tokens" if len(seqs) > 1 else "")
    shorter = shorter_seq_lens(seqs, model.max_position_embeddings) if req.seq_len is None else []
    for seq in shorter:
        for variant in chain:
            tiers += _variant_tiers(req, t, rules, global_batch, variant, [seq], lora,
                                    tag=lambda seq: f" at {seq} tokens (below {t.mode}'s {min(seqs)})")
    # Last: adapters on the attention projections only (fewer adapter states and activations), for
    # the default all-linear LoRA; a user's own --lora targets are kept.
    attention = space.attention_lora(model) if req.lora is None else None
    if attention is not None and attention != lora:
        for variant in [v for v in chain if variants.uses_adapters(v)]:
            tiers += _variant_tiers(req, t, rules, global_batch, variant, [*seqs, *shorter], attention,
                                    tag=lambda seq: f" on attention only at {seq} tokens")
    return tiers


def _variant_tiers(req: PlanRequest, t: ModeTargets, rules: DeviceRules, global_batch: int, variant: str,
                   seqs: list[int], lora: LoraSettings, tag) -> list[Tier]:
    """One variant at these sequence lengths: on the devices alone, then with CPU offload (full weights)."""
    label = variants.LABELS[variant]
    tiers = [_tier(f"{label}{tag(seq)}", _base(req, variant, rules, seq, lora), rules, t, global_batch,
                   offload=False) for seq in seqs]
    probe = _base(req, variant, rules, seqs[0], lora)
    full_weights = probe.lora is None and probe.method not in ("inference",)
    if t.offload and full_weights and rules.device in ("cuda", "rocm"):
        tiers += [_tier(f"{label} with CPU offload{tag(seq)}", _base(req, variant, rules, seq, lora), rules, t,
                        global_batch, offload=True) for seq in seqs]
    return tiers


# Extreme's "largest micro-batch" may give up at most this much speed against the fastest setting
# (a bigger batch that is much slower would only shrink what the mode can train in its time).
LARGEST_BATCH_SLOWDOWN = 1.10


def _rank_key(t: ModeTargets, inference: bool):
    def key(c: Candidate) -> tuple:
        step = c.speed.step_seconds if c.speed else math.inf
        if inference:
            return (-c.setup.micro_batch, step, c.need_ratio)
        return (step, c.need_ratio)
    return key


def _memory_fn(req: PlanRequest, rules: DeviceRules):
    """The memory model, with this machine's measured ratio applied like `estimate` applies it."""
    from trainfit.core.memory import estimate_memory

    if req.memory_factor == 1.0:
        return estimate_memory
    from trainfit.core.memory.calibrated import apply_memory_factor

    prefix = "cuda" if rules.device in ("cuda", "rocm") else rules.device
    return lambda m, s, h: apply_memory_factor(estimate_memory(m, s, h), prefix, req.memory_factor,
                                               req.calibration_source)


def _largest_batch_near_fastest(result: SearchResult) -> SearchResult:
    """Extreme: the largest micro-batch among settings within LARGEST_BATCH_SLOWDOWN of the fastest."""
    if result.best is None or result.best.speed is None:
        return result
    limit = result.best.speed.step_seconds * LARGEST_BATCH_SLOWDOWN
    near = [c for c in result.fitting if c.speed is not None and c.speed.step_seconds <= limit]
    pick = max(near, key=lambda c: (c.setup.micro_batch, -c.speed.step_seconds))  # type: ignore[union-attr]
    rest = [c for c in result.fitting if c is not pick]
    return dataclasses.replace(result, best=pick, fitting=[pick, *rest])


def _budget(req: PlanRequest, t: ModeTargets) -> Budget:
    return Budget(share=t.memory_share, bytes_override=req.memory_budget_bytes)


def _speed_fn(req: PlanRequest, rules: DeviceRules):
    from trainfit.core.speed import predict_step
    from trainfit.core.speed.rates import device_rates

    rates = device_rates(req.hardware, rules.device)
    return lambda m, s: predict_step(m, s, rates)


def _search_model(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec) -> SearchResult:
    from trainfit.core.speed import predict_step
    from trainfit.core.speed.rates import device_rates

    global_batch = req.target_batch or t.global_batch
    rates = device_rates(req.hardware, rules.device)  # once per search, not per candidate
    from trainfit.core.frameworks import framed_tiers

    tiers = framed_tiers(_tiers(req, t, rules, model, global_batch), req.framework)  # type: ignore[arg-type]
    result = search(model, req.hardware, tiers,
                     rank_key=_rank_key(t, req.method == "inference"), budget=_budget(req, t), rules=rules,
                     speed_fn=measured.speed_fn(req, model, lambda m, s: predict_step(m, s, rates)),
                     memory_fn=_memory_fn(req, rules))
    if t.largest_micro_batch and req.method != "inference":
        result = _largest_batch_near_fastest(result)
    return measured.pinned(req, t.mode, model, result)


# ---------------------------------------------------------------------------------------------
# one mode for a given model
def _workload(req: PlanRequest, s: TrainingSetup, tokens: int | None = None) -> Workload | None:
    """The run's data: the pretraining budget, --dataset-tokens, else the rows at their lengths
    (packed SFT trains their tokens; unpacked, one row per sequence), else --examples."""
    if tokens is not None:
        return Workload(dataset_tokens=tokens, epochs=1.0)
    if req.dataset_tokens:
        return Workload(dataset_tokens=req.dataset_tokens, epochs=req.epochs)
    from_data = data_io.dataset_workload(req.dataset, s, req.epochs)
    if from_data is not None:
        return from_data
    return Workload(examples=req.examples, epochs=req.epochs) if req.examples else None


def _plan_model(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec,
                result: SearchResult | None = None, pretrain_tokens: int | None = None,
                pretrain: dict | None = None, extra_reasons: list[str] | None = None,
                extra_warnings: list[str] | None = None) -> ModePlan:
    result = result or _search_model(req, t, rules, model)
    measured.note_search(t.mode, model, result)  # the probe reads the search behind each pick
    budget = _budget(req, t)
    cap = _capacity(req, rules)
    reasons = list(extra_reasons or [])
    warnings = list(extra_warnings or []) + _moe_quant_warning(req, rules, model, result)
    if result.best is None:
        need = result.smallest_need_ratio
        why = "; ".join(f"{k}: {v}" for k, v in result.rejected.items()) or "nothing could be evaluated"
        warnings.append(f"nothing fits {t.memory_share:.0%} of the usable memory ({why})")
        if math.isfinite(need):
            warnings.append(f"the closest setting needs {need:.2f}x this mode's memory budget: use a larger "
                            "GPU (trainfit cloud), more GPUs, or a smaller model")
        if req.method != "inference":
            warnings += _shorter_seq_advice(req, t, rules, model)
        return ModePlan(mode=t.mode, fits=False, model_id=model.id, params_total=None, setup=None, memory=None,
                        memory_budget_bytes=budget.limit(cap), memory_used_bytes=None, speed=None, power=None,
                        run=None, reasons=reasons, warnings=warnings, targets=t, model=model, pretrain=pretrain,
                        candidates_evaluated=result.evaluated)
    best = result.best
    s = best.setup
    workload = _workload(req, s, pretrain_tokens)
    sized = lengths.data_lengths(req.dataset, s) if pretrain_tokens is None else None
    run_pred = measured.predict_run(req, model, s, workload)
    data_plan, speed, power = data_io.plan_for_mode(req, t.mode, t.memory_share, t.hours_max, s, run_pred.speed,
                                                    run_pred.power, best.memory, pretrain_tokens)
    asked_hours = speed.total_seconds / 3600 if speed.total_seconds is not None else None
    asked_steps = speed.total_steps
    speed, power = _what_runs(speed, power, data_plan)
    used = max(d.needed_bytes for d in best.memory.devices if d.device != "cpu" or len(best.memory.devices) == 1)
    hours = speed.total_seconds / 3600 if speed.total_seconds is not None else None
    rental = hours * req.usd_per_hour if hours is not None and req.usd_per_hour is not None else None
    tokens = None
    packed = s.method == "pretrain" or (data_plan is not None and data_plan.packing)
    if speed.total_steps is not None and sized is not None and not packed:
        # the data's own tokens, not the padded sequences; the share of them a capped run reaches
        tokens = int(sized.epoch_tokens * req.epochs * speed.total_steps / max(asked_steps or 1, 1))
    elif speed.total_steps is not None:  # packed: full sequences of data (to within the last step)
        tokens = int(speed.total_steps * s.global_batch * s.seq_len * (2 if s.method == "dpo" else 1))
    run = RunFigures(tokens, speed.total_steps, hours, power.energy_kwh, power.electricity_cost, rental)
    spot_reasons: list[str] = []
    if req.spot is not None:  # plan --flavor ID --spot: cadence and expected cost with interruptions
        from trainfit.core.spot import plan_figures

        run, spot_reasons, spot_warnings = plan_figures(req.spot, t.mode, s, best.memory, run, req.budget_usd)
        warnings += spot_warnings
    reasons += _reasons(model, req, t, rules, result, best, budget, cap) + run_pred.notes + spot_reasons
    reasons += _shorter_seq_reasons(req, t, model, s, sized) + _length_reasons(sized, s, data_plan.packing if data_plan else None)
    warnings += _truncation_warnings(sized, s)
    warnings += _warnings(req, t, rules, s, speed, power, asked_hours, rental, best, budget.limit(cap))
    warnings += data_plan.warnings if data_plan is not None else []
    from trainfit.core.plan.host_ram import host_ram_need_bytes

    return ModePlan(mode=t.mode, fits=True, model_id=model.id, params_total=best.memory.params_total, setup=s,
                    memory=best.memory, memory_budget_bytes=budget.limit(cap), memory_used_bytes=used,
                    speed=speed, power=power, run=run, reasons=reasons, warnings=warnings, targets=t, model=model,
                    pretrain=pretrain, candidates_evaluated=result.evaluated, data_io=data_plan,
                    data_lengths=sized, host_ram_bytes=host_ram_need_bytes(best.memory, s, req.hardware))


def _what_runs(speed: SpeedEstimate, power: PowerEstimate, data_plan: DataPlan | None
               ) -> tuple[SpeedEstimate, PowerEstimate]:
    """The run the files will run: when the mode's hours or the --budget dollars cut the data (the
    data plan's token budget, the exported max_steps), its steps, run time and energy are the cut
    run's, so the headline, the cost and the files tell one story."""
    b = data_plan.budget if data_plan is not None else None
    if b is None or not b.capped_by or not b.steps or not speed.total_steps or b.steps >= speed.total_steps:
        return speed, power
    share = b.steps / speed.total_steps
    speed = dataclasses.replace(speed, total_steps=b.steps, total_seconds=b.steps * speed.step_seconds)
    power = dataclasses.replace(
        power, run_seconds=None if power.run_seconds is None else power.run_seconds * share,
        energy_kwh=None if power.energy_kwh is None else power.energy_kwh * share,
        electricity_cost=None if power.electricity_cost is None else power.electricity_cost * share)
    return speed, power


# A sequence length that cuts off more than this share of the examples gets a warning.
TRUNCATION_WARNING_SHARE = 0.25


def _shorter_seq_reasons(req: PlanRequest, t: ModeTargets, model: ModelSpec, s: TrainingSetup,
                         sized: lengths.DataLengths | None) -> list[str]:
    """Why the sequence is shorter than the mode's own, and (without a data size, whose line says it)
    what that cuts off at typical lengths."""
    own = _seq_lens(req, t, model)
    if req.seq_len is not None or s.seq_len >= min(own):
        return []
    cut = "what it truncates: see data" if sized is not None else lengths.truncation_at(req.dataset, s.method,
                                                                                           s.seq_len)
    return [f"seq {s.seq_len}: none of {t.mode}'s {' / '.join(map(str, own))} tokens fits, so shorter sequences "
            f"down to {SEQ_FLOOR} were tried; {cut}"]


def _shorter_seq_advice(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec) -> list[str]:
    """Nothing fits: the longest shorter --seq-len that would (a user's --seq-len is kept, not
    overridden), or that even the floor does not."""
    if req.seq_len is None:
        tried = ([f"sequences down to {SEQ_FLOOR} tokens"]
                 if shorter_seq_lens(_seq_lens(req, t, model), model.max_position_embeddings) else [])
        if req.lora is None and space.attention_lora(model) is not None and \
                any(variants.uses_adapters(v) for v in variants.chain(req.method)):
            tried.append("LoRA on the attention projections only")
        return [f"also tried, and none fits: {' and '.join(tried)}"] if tried else []
    for seq in shorter_seq_lens([req.seq_len], model.max_position_embeddings):
        result = _search_model(dataclasses.replace(req, seq_len=seq), t, rules, model)
        if result.best is not None:
            return [f"--seq-len {seq} fits ({result.tier} at {result.best.need_ratio:.0%} of this mode's budget); "
                    f"{lengths.truncation_at(req.dataset, result.best.setup.method, seq)}"]
    return [f"a shorter --seq-len does not fit either (tried down to {SEQ_FLOOR})"] if req.seq_len > SEQ_FLOOR else []


def _length_reasons(sized: lengths.DataLengths | None, s: TrainingSetup, packed: bool | None) -> list[str]:
    if sized is None:
        return []
    unit = "pairs" if s.method == "dpo" else "documents" if s.method == "pretrain" else "examples"
    rows = ("packed into full sequences" if packed or s.method == "pretrain"
            else f"not packed: steps are timed at the full {s.seq_len} tokens per sequence (an upper bound: the "
                 "collator pads to the longest row of each micro-batch)")
    return [f"data: {sized.rows:,} {unit} x {sized.mean_row_tokens:,.0f} tokens on average = "
            f"{_count(sized.epoch_tokens)} tokens per epoch as trained, {rows}; "
            f"{lengths.truncation_text(sized, s.method)} ({sized.how})"]


def _truncation_warnings(sized: lengths.DataLengths | None, s: TrainingSetup) -> list[str]:
    if sized is None or sized.truncated_share < TRUNCATION_WARNING_SHARE:
        return []
    return [f"{lengths.truncation_text(sized, s.method)}: a longer --seq-len (more memory) or shorter examples "
            "keep them whole"]


def _moe_quant_warning(req: PlanRequest, rules: DeviceRules, model: ModelSpec, result: SearchResult) -> list[str]:
    """Why QLoRA saves little on an MoE model here: transformers >= 5 fuses the experts into 3-D
    parameters, which bitsandbytes leaves 16-bit (core.memory.quant_formats.experts_left_dense)."""
    if not model.num_experts or not rules.quantization or req.method not in ("auto", "full", "qlora"):
        return []
    st = model_stats(model)
    probe = result.best.setup if result.best is not None else TrainingSetup(method="qlora", quant="nf4-dq")
    if probe.method != "qlora" or not experts_left_dense(st, probe):
        return []
    return [f"QLoRA quantises only {1 - st.experts / st.linear:.0%} of this MoE's linear weights: "
            + dense_experts_text(st)]


def _capacity(req: PlanRequest, rules: DeviceRules) -> int | None:
    from trainfit.core.memory.overheads import cpu_capacity, gpu_capacity

    if req.memory_budget_bytes is not None:
        return req.memory_budget_bytes
    return cpu_capacity(req.hardware) if rules.device == "cpu" else gpu_capacity(req.hardware)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n != float("inf") else "no limit"


def _cap_gib(cap: int | None) -> str:
    """The device capacity, or why there is none: an unknown size is not 0 GiB."""
    return _gib(cap) if cap is not None else "unknown memory (not read by the profile: not checked)"


def _reasons(model: ModelSpec, req: PlanRequest, t: ModeTargets, rules: DeviceRules, result: SearchResult,
             best: Candidate, budget: Budget, cap: int | None) -> list[str]:
    from trainfit.core.memory import estimate_memory

    s = best.setup
    limit = budget.limit(cap)
    out = [rules.reasons["precision"] if s.precision != "fp32" or rules.half is None
           else f"fp32: the speed model finds 16-bit no faster here ({rules.label})"]
    method_label = result.tier or s.method
    if result.rejected:
        out.append(f"{method_label}: chosen because what is tried before it does not fit within {_gib(limit)} "
                   f"({t.memory_share:.0%} of {_cap_gib(cap)} usable): "
                   + "; ".join(f"{k} {v}" for k, v in result.rejected.items()))
    else:
        out.append(f"{method_label}: fits in {_gib(best.memory.devices[0].needed_bytes)} of this mode's "
                   f"{_gib(limit)} ({t.memory_share:.0%} of {_cap_gib(cap)} usable)")
    fitting = result.fitting
    order = ("the largest micro-batch that fits" if s.method == "inference" else
             f"the largest micro-batch within {LARGEST_BATCH_SLOWDOWN - 1:.0%} of the fastest" if t.largest_micro_batch
             else "the fastest")
    out.append(f"micro-batch {s.micro_batch} x accumulation {s.grad_accum}"
               + (f" x {s.num_gpus} GPUs" if s.num_gpus > 1 else "")
               + f" = global batch {s.global_batch}: {order} of {len(fitting)} fitting settings")
    if s.grad_checkpointing != "none":
        without = [c for c in fitting if c.setup.grad_checkpointing == "none"]
        if not without:
            out.append("gradient checkpointing: no setting without it fits")
        else:
            out.append(_checkpointing_reason(best, without[0]))
    if s.zero_stage or s.offload != "none":
        plain = dataclasses.replace(s, zero_stage=0, offload="none")
        try:
            need = estimate_memory(model, plain, req.hardware).devices[0].needed_bytes
            what = f"ZeRO-{s.zero_stage}" + (f" + {s.offload} offload to CPU" if s.offload != "none" else "")
            if need > limit:
                out.append(f"{what}: replicated on each GPU it needs {_gib(need)}, {_gib(limit)} available")
            else:
                out.append(f"{what}: predicted faster than plain data parallelism here")
        except BadInputError:
            pass
    if s.optimizer != "adamw":
        out.append(f"{s.optimizer}: 8-bit optimizer states (bitsandbytes) cut 12 B/param to ~6")
    if s.attention == "flash":
        out.append(rules.reasons["attention"])
    if s.lora is not None:
        targets = s.lora.target_modules if isinstance(s.lora.target_modules, str) else ",".join(s.lora.target_modules)
        out.append(f"LoRA rank {s.lora.rank}, alpha {s.lora.alpha} on {targets}")
    if rules.device == "cpu":
        out.append(rules.reasons["threads"])
    elif s.num_gpus > 1:
        out.append(_sharding_reason(rules, s))
        out.extend(multinode.sharding_reasons(model, s, req.hardware, limit, _speed_fn(req, rules),
                                              step_time_factor=req.step_time_factor))
    if req.usd_per_hour is not None:
        out.append(f"cost at ${req.usd_per_hour:.2f}/h" + (f" against the ${req.budget_usd:g} budget"
                                                          if req.budget_usd is not None else ""))
    return out


def _checkpointing_reason(best: Candidate, without: Candidate) -> str:
    """Why gradient checkpointing is on when a setting without it fits too: what it buys, in the
    figures the ranking compared (never "allows micro-batch 1 ... (micro-batch 1)")."""
    from trainfit.core.durations import duration_text

    s, w = best.setup, without.setup
    mine = best.speed.step_seconds if best.speed else math.nan
    theirs = without.speed.step_seconds if without.speed else math.nan
    steps = f"{duration_text(mine)} per step against {duration_text(theirs)}"
    if s.micro_batch > w.micro_batch:
        gain = ("predicted faster" if mine <= theirs else
                "kept by this mode's ranking (the largest micro-batch near the fastest)")
        return (f"gradient checkpointing: it allows micro-batch {s.micro_batch} where at most {w.micro_batch} fits "
                f"without it; {gain}: {steps}")
    if mine <= theirs:
        return (f"gradient checkpointing: predicted faster than the fastest setting without it "
                f"(micro-batch {w.micro_batch}, {w.seq_len} tokens): {steps}")
    return (f"gradient checkpointing: kept by this mode's ranking; the fastest setting without it "
            f"(micro-batch {w.micro_batch}) is predicted at {duration_text(theirs)} per step")


def _sharding_reason(rules: DeviceRules, s: TrainingSetup) -> str:
    """The interconnect and the sharding the chosen setting runs (the interconnect alone argues for none)."""
    chosen = (("FSDP hybrid sharding" if s.hybrid_shard else f"ZeRO-{s.zero_stage}") if s.zero_stage
              else "DDP (every GPU holds the whole model)")
    return f"{rules.reasons['sharding']}; the chosen setting runs {chosen}"


def _warnings(req: PlanRequest, t: ModeTargets, rules: DeviceRules, s: TrainingSetup, speed: SpeedEstimate,
              power: PowerEstimate, hours: float | None, rental: float | None, best: Candidate,
              limit: float) -> list[str]:
    out = []
    if hours is not None and hours > t.hours_max:
        frac = t.hours_max / hours
        out.append(f"the data asked for takes {hours_text(hours)}, over this mode's {hours_text(t.hours_max)}: at "
                   f"{speed.tokens_per_second:,.0f} tokens/s, {frac:.0%} of it fits the time")
    if rental is not None and req.budget_usd is not None and rental > req.budget_usd:
        out.append(f"cost ${rental:.2f} is over the ${req.budget_usd:g} budget: it buys "
                   f"{req.budget_usd / rental:.0%} of this run (fewer examples or epochs, or a cheaper machine: "
                   "trainfit cloud)")
    limit_w = power.gpu_limit_watts_each
    if power.gpu_count and limit_w:
        share = power.gpu_watts_each / limit_w
        low, high = t.tdp_share
        if share > high + 0.05:
            cap = int(limit_w * high)
            out.append(f"expected GPU draw {power.gpu_watts_each:.0f} W = {share:.0%} of its {limit_w:.0f} W limit, "
                       f"above {t.mode}'s {high:.0%}: {power_cap_hint(rules.device, cap)} (slower)")
    if t.mode == "extreme":
        out.append(f"extreme: {best.need_ratio * t.memory_share:.0%} of usable memory; a longer batch or a "
                   "memory spike can OOM. Watch temperatures and throttling (trainfit profile) on long runs")
        if power.gpu_count:
            out.append(f"sustained ~{power.total_watts:.0f} W for the whole run: check PSU headroom and cooling")
    out += _host_ram_warnings(req, t, s, best)
    pressed = next((d for d in best.memory.devices if d.fits_under_pressure), None)
    if pressed is not None:
        out.append(under_pressure_text(pressed))
    if rules.laptop and t.mode != "conservative":
        out.append(rules.reasons.get("thermal", "laptop GPU: thermal limits"))
    if req.hardware.power.on_ac is False:
        out.append("on battery: plug in before training")
    return out


def _host_ram_warnings(req: PlanRequest, t: ModeTargets, s: TrainingSetup, best: Candidate) -> list[str]:
    """The host's RAM (this machine's, the catalog machine's, or the rented flavor's): the search
    refuses a setting over it; one within it but over this mode's share of it is worth a word."""
    from trainfit.core.plan.host_ram import host_ram_need_bytes, ram_is_the_device

    usable = req.hardware.memory.usable_bytes
    if ram_is_the_device(s, req.hardware) or not usable:
        return []
    need = host_ram_need_bytes(best.memory, s, req.hardware)
    if need <= t.memory_share * usable:
        return []
    return [f"host RAM: the training process(es) hold {_gib(need)} of the host's {_gib(usable)} usable "
            f"({need / usable:.0%}), over {t.mode}'s {t.memory_share:.0%}: little is left for the data cache "
            "and other programs"]


# ---------------------------------------------------------------------------------------------
# pretraining: the planner chooses the size
@functools.lru_cache(maxsize=256)
def shape_for_params(label: str, vocab_size: int, max_positions: int) -> ModelSpec:
    """core.model_shapes.shape_for_params, remembered: every mode walks the same ladder."""
    from trainfit.core.model_shapes import shape_for_params as shape

    return shape(label, vocab_size=vocab_size, max_positions=max_positions)


def _plan_pretrain(req: PlanRequest, t: ModeTargets, rules: DeviceRules) -> ModePlan:
    lo, hi = t.params_range
    # One position table for every mode (RoPE shapes do not grow with it), so shapes are shared.
    max_pos = max(req.seq_len or 0, *DEFAULTS["extreme"].seq_lens)
    tried = _walk_ladder(req, t, rules, max_pos)
    if not tried:
        spec = shape_for_params(_count(PRETRAIN_LADDER[0]).lower(), req.vocab_size, max_pos)
        return _plan_model(dataclasses.replace(req, method="pretrain"), t, rules, spec)
    in_time = [x for x in tried if x[3] is not None and x[3] <= t.hours_max]
    in_range_in_time = [x for x in in_time if lo <= x[0] <= hi]
    reasons, warnings = [], []
    if in_range_in_time:
        pick = in_range_in_time[-1]
        reasons.append(f"size: {_count(pick[0])} parameters, the largest of {_range(lo, hi)} whose "
                       f"{t.tokens_per_param:g} tokens/parameter train within {hours_text(t.hours_max)}")
    elif in_time:
        pick = in_time[-1]
        smallest = next((x for x in tried if x[0] >= lo), None)
        reasons.append(f"size: {_count(pick[0])} parameters, the largest that trains "
                       f"{t.tokens_per_param:g} tokens/parameter within {hours_text(t.hours_max)} here")
        if smallest is not None and smallest[3] is not None:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters within {hours_text(t.hours_max)}; "
                            f"{_count(smallest[0])} needs {_count(smallest[4])} tokens = {hours_text(smallest[3])} on "
                            f"this hardware, so the plan is {_count(pick[0])} instead")
        elif pick[0] < lo:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters; "
                            f"{_count(tried[-1][0] if tried else lo)} is the largest that fits the memory budget")
    else:
        pick = tried[0]
        reasons.append(f"size: {_count(pick[0])}, the smallest shape tried")
        warnings.append(f"even {_count(pick[0])} parameters x {t.tokens_per_param:g} tokens/parameter takes "
                        f"{hours_text(pick[3])} here, over this mode's {hours_text(t.hours_max)}")
        target = next((x for x in tried if x[0] >= lo), None)
        if target is not None and target[3] is not None:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters: {_count(target[0])} would need "
                            f"{hours_text(target[3])} on this hardware")
    n, spec, result, hours, tokens = pick
    if req.dataset_tokens is not None and req.dataset_tokens < tokens:
        warnings.append(f"the dataset has {_count(req.dataset_tokens)} tokens: the {_count(tokens)}-token budget "
                        f"repeats it {tokens / req.dataset_tokens:.1f} times (beyond ~4 epochs repeats add little)")
    info = {"params": n, "params_exact": result.best.memory.params_total if result.best else None,
            "tokens": tokens, "tokens_per_param": t.tokens_per_param,
            "flops": 6 * n * tokens, "shape": {"layers": spec.num_layers, "hidden": spec.hidden_size,
                                               "heads": spec.num_heads, "kv_heads": spec.num_kv_heads}}
    reasons.append(f"token budget: {t.tokens_per_param:g} x {_count(n)} = {_count(tokens)} tokens, "
                   f"C = 6ND = {6 * n * tokens:.2e} FLOPs")
    return _plan_model(dataclasses.replace(req, method="pretrain"), t, rules, spec, result, tokens, info,
                       reasons, warnings)


LadderEntry = tuple  # (params, spec, SearchResult, hours | None, tokens)


def _walk_ladder(req: PlanRequest, t: ModeTargets, rules: DeviceRules, max_pos: int) -> list[LadderEntry]:
    """The ladder sizes searched for this mode, smallest first (those that fit the memory).

    Fitting the memory and training within the mode's hours both only get harder as the size
    grows, so the largest size that does both is found by bisection (a few searches instead of
    one per rung): first inside the mode's range, else below it. The smallest size of the range
    is always searched (its hours explain a smaller plan), and so is the largest that fits when
    nothing in the range does."""
    entries: dict[int, LadderEntry | None] = {}

    def entry(i: int) -> LadderEntry | None:
        if i not in entries:
            n = PRETRAIN_LADDER[i]
            spec = shape_for_params(_count(n).lower(), req.vocab_size, max_pos)
            tokens = int(t.tokens_per_param * n)
            result = _search_model(dataclasses.replace(req, method="pretrain"), t, rules, spec)
            entries[i] = None if result.best is None else (n, spec, result, _hours(result.best, tokens), tokens)
        return entries[i]

    def fits(i: int) -> bool:
        return entry(i) is not None

    def in_time(i: int) -> bool:
        e = entry(i)
        return e is not None and e[3] is not None and e[3] <= t.hours_max

    def largest(test, first: int, last: int) -> int | None:
        """The largest index in [first, last] passing `test` (true up to some index, then false)."""
        found = None
        while first <= last:
            mid = (first + last) // 2
            if test(mid):
                found, first = mid, mid + 1
            else:
                last = mid - 1
        return found

    top = len(PRETRAIN_LADDER) - 1
    start = next((i for i, n in enumerate(PRETRAIN_LADDER) if n >= t.params_range[0]), top)
    end = max((i for i, n in enumerate(PRETRAIN_LADDER) if n <= t.params_range[1]), default=start)
    if in_time(start):
        largest(in_time, start, max(start, end))
    else:
        below = largest(in_time, 0, start - 1)
        fits(0)  # the smallest size is the plan when none trains in time
        if not fits(start):
            largest(fits, below if below is not None else 0, start - 1)
    return [e for _, e in sorted(entries.items()) if e is not None]


def _hours(best: Candidate, tokens: int) -> float | None:
    """Run time of `tokens` at the step time the search predicted for `best` (no second prediction)."""
    from trainfit.core.speed.predict import with_workload

    if best.speed is None:
        return None
    return with_workload(best.speed, best.setup, Workload(dataset_tokens=tokens)).total_seconds / 3600


def _range(lo: int, hi: int) -> str:
    return f"{_count(lo)}+" if hi >= PRETRAIN_LADDER[-1] else f"{_count(lo)}-{_count(hi)}"


def _count(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"
