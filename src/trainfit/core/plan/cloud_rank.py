"""Rank cloud flavors for one training job: does it fit, with which setting, how long, how much.

For every flavor the memory model (trainfit.core.memory) and the speed model (core.speed) are run
over a small grid: the method as asked, then LoRA / QLoRA when fallback is allowed (a cheaper
method is only used when the asked one fits nowhere on that flavor); precision by GPU capability
(bf16 on Ampere and newer, fp16 on Turing / Volta); micro-batch 1..32 (the largest that fits is
not always the fastest, so all fitting ones are timed); gradient checkpointing off / on; ZeRO-2 /
ZeRO-3 on multi-GPU machines. The flavor's host RAM (ram_gib) must hold what the setting keeps
there (CPU offload, the model while it loads: core.plan.host_ram). Flavors with the same GPUs,
vCPUs and RAM are evaluated once and priced apiece.

Time = run time predicted for the dataset + a fixed setup time (image pull, dependency install,
weight download; seed 004's "5-10 steps, ~10-15 minutes" quick demo implies ~10 minutes).
Cost = hours x the flavor's hourly price. With spot=True a flavor with a spot price is priced at
it and ranked by its expected cost including interruptions (core.cloud.spot): checkpoints at the
interval the trainer will use (core.run.checkpoint_cadence, balanced mode, the flavor's interruption
figure included), the work re-done after each interruption and a restart (the setup time again
plus reading the checkpoint back); `hours` and `cost_usd` are then those expected figures, and
`spot` holds the breakdown. Flavors without a spot price fall back to on-demand and say so.
Cost classes follow seed 004: under $5, $5-20, $20-50, $50-200, over $200.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from trainfit.core.cloud.catalog import CloudCatalog, Flavor, SpotTerms
from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.models.spec import ModelSpec
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.plan.engine import MemoryFn
from trainfit.core.plan.space import default_lora
from trainfit.core.setup import TRAIN_METHODS, LoraSettings, Method, TrainingSetup
from trainfit.core.speed import DeviceRates, Workload, cpu_rates, gpu_spec_rates, predict_step
from trainfit.core.cloud.spot import SpotEstimate, checkpoint_bytes_for, estimate_spot, hours_text
from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.errors import BadInputError

GIB = 1 << 30
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
COST_CLASSES = ((5.0, "under $5"), (20.0, "$5-20"), (50.0, "$20-50"), (200.0, "$50-200"), (math.inf, "over $200"))
DEFAULT_SETUP_MINUTES = 10.0
DEFAULT_GLOBAL_BATCH = 16


@dataclass(frozen=True)
class CloudRequest:
    model: ModelSpec
    method: Method
    seq_len: int
    workload: Workload
    allow_fallback: bool = True  # LoRA / QLoRA when the asked method fits nowhere on a flavor
    budget_usd: float | None = None
    max_hours: float | None = None
    global_batch: int = DEFAULT_GLOBAL_BATCH
    setup_minutes: float = DEFAULT_SETUP_MINUTES
    lora: LoraSettings | None = None  # default: rank 16 on every linear of the blocks (not lm_head)
    spot: bool = False
    # The tool that will run the job (core.frameworks.Framework, `--framework`): every setting's memory
    # and time are that tool's. None: trainfit's own run.
    framework: object | None = None


@dataclass(frozen=True)
class FlavorResult:
    flavor: str
    provider: str
    gpu: str | None
    gpu_count: int
    usd_per_hour: float | None
    fits: bool
    why: str  # one line: the setting chosen, or why nothing fits
    method: str | None = None
    precision: str | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    grad_checkpointing: str | None = None
    zero_stage: int | None = None
    offload: str | None = None  # "optimizer" / "optimizer+params": DeepSpeed CPU offload of the chosen setting
    memory_gib_per_device: float | None = None  # what the chosen setting needs per GPU (GiB): the fit verdict's figure
    capacity_gib_per_device: float | None = None
    memory_ratio: float | None = None  # smallest need / capacity seen (for "closest")
    tokens_per_second: float | None = None
    bottleneck: str | None = None
    hours: float | None = None
    cost_usd: float | None = None
    cost_class: str | None = None
    within_budget: bool | None = None
    within_time: bool | None = None
    price_source: str = ""
    price_as_of: str = ""
    price_kind: str = "on-demand"  # "spot" when priced at a spot price
    spot_note: str = ""  # with spot=True: why this flavor is priced on-demand
    on_demand_usd_per_hour: float | None = None
    hours_uninterrupted: float | None = None  # spot: setup + training, no interruption
    cost_usd_uninterrupted: float | None = None
    spot: SpotEstimate | None = None  # spot: interruption figure, cadence and the expected run


@dataclass(frozen=True)
class CloudRanking:
    model_id: str
    method: str
    tokens_per_epoch: int
    epochs: float
    results: list[FlavorResult]  # best first
    cheapest: str | None  # flavor id: cheapest that fits and meets the limits
    fastest: str | None  # fastest that fits and stays within the budget (and time limit)
    recommendation: str
    reasoning: list[str]
    closest: str | None  # when nothing qualifies: the flavor that came closest
    skipped: dict[str, str]  # flavor id -> why it was not evaluated
    spot: bool = False  # spot prices and expected costs with interruptions where known


def method_label(s: TrainingSetup) -> str:
    """'full', 'lora', 'qlora', 'dpo', 'dpo+lora', 'dpo+qlora'."""
    if s.method == "dpo" and s.lora is not None:
        return "dpo+qlora" if s.quant != "none" else "dpo+lora"
    return s.method


def cost_class(usd: float) -> str:
    for limit, name in COST_CLASSES:
        if usd < limit:
            return name
    return COST_CLASSES[-1][1]


@dataclass(frozen=True)
class _Best:
    setup: TrainingSetup
    memory: MemoryEstimate
    seconds: float
    tokens_per_second: float
    bottleneck: str


def _search(
    req: CloudRequest, hw: HardwareProfile, rates: DeviceRates, n: int, memory_fn: MemoryFn
) -> tuple[_Best | None, float, str]:
    """Fastest fitting setting on one machine (the planner engine's "fastest" policy: one tier
    per method variant, chains over the micro-batch); else (None, smallest need/capacity, reason)."""
    from trainfit.core.plan import space, variants
    from trainfit.core.plan.engine import Tier, by_step_time, search
    from trainfit.core.plan.hardware_rules import rules_for

    rules = rules_for(hw)
    zero_stages = (0,) if n == 1 else (2, 3)
    tiers = []
    for variant in variants.chain(req.method, fallback=req.allow_fallback):
        base = variants.base_setup(variant, hw, rules, seq_len=req.seq_len, lora=req.lora, num_gpus=n)
        base = dataclasses.replace(base, attention="sdpa")
        bases = space.product(base, grad_checkpointing=("none", "full"), zero_stage=zero_stages)
        batches = [mb for mb in MICRO_BATCHES if mb * n <= max(req.global_batch, n)]
        tiers.append(Tier(variants.LABELS[variant], space.batch_chains(bases, batches, req.global_batch)))
        if base.lora is None and base.method != "inference":
            # Full weights that do not fit on the GPUs: DeepSpeed's CPU offload comes before the
            # fallback to adapters (the method asked for, as estimate --offload shows it fitting).
            offloaded = space.product(base, grad_checkpointing=("full",), zero_stage=(2, 3),
                                      offload=("optimizer", "optimizer+params"))
            tiers.append(Tier(f"{variants.LABELS[variant]} + CPU offload",
                              space.batch_chains(offloaded, batches, req.global_batch)))
    from trainfit.core.frameworks import framed_tiers

    tiers = framed_tiers(tiers, req.framework)  # type: ignore[arg-type]
    result = search(req.model, hw, tiers, rank_key=by_step_time, memory_fn=memory_fn,
                    speed_fn=lambda m, s: predict_step(m, s, rates, workload_for(req, s)))
    ratio = result.smallest_need_ratio
    if result.best is not None:
        b = result.best
        return _Best(b.setup, b.memory, b.speed.total_seconds, b.speed.tokens_per_second, b.speed.bottleneck), ratio, ""  # type: ignore[union-attr,arg-type]
    reason = "no setting fits"
    if result.rejected:
        label, why = list(result.rejected.items())[-1]
        reason = f"{label} {why}"
    return None, ratio, f"does not fit: best setting needs {ratio:.2f}x the memory ({reason})"


def flavor_hardware(flavor: Flavor) -> HardwareProfile:
    """The machine a flavor rents, as a HardwareProfile (what `plan --flavor` plans for)."""
    return _hardware(flavor)[0]


def _hardware(flavor: Flavor) -> tuple[HardwareProfile, DeviceRates]:
    from trainfit.core.machines.gpu_catalog import get_gpu
    from trainfit.core.machines.hardware_spec import resolve_hardware

    if flavor.kind == "cpu":
        ram = int(flavor.ram_gib or 16)
        hw = resolve_hardware(f"cpu-{ram}gb")
        cores = float(max(1, (flavor.vcpus or 2)))
        hw = dataclasses.replace(hw, cpu=dataclasses.replace(hw.cpu, usable_cores=cores, logical_cores=int(cores)))
        return hw, cpu_rates(hw)
    hw = with_flavor_host(resolve_hardware(f"{flavor.gpu_count}x {flavor.gpu}"), flavor)
    # with its machine, so speed terms that depend on what fits (a paged optimizer's spill) match estimate's
    rates = dataclasses.replace(gpu_spec_rates(get_gpu(flavor.gpu), flavor.gpu_count), profile=hw)  # type: ignore[arg-type]
    return hw, rates


def with_flavor_host(hw: HardwareProfile, flavor: Flavor) -> HardwareProfile:
    """The catalog machine with the flavor's own host: its RAM (data/cloud.yaml ram_gib, which an
    offloaded optimizer and the model loading must fit) and its vCPUs (data-loader workers), not
    the typical host a bare GPU spec assumes."""
    from trainfit.core.machines.profile import os_reserve_bytes

    if flavor.ram_gib is not None:
        ram = int(flavor.ram_gib * GIB)
        reserve = os_reserve_bytes(ram, desktop=False, in_cgroup=False)
        hw = dataclasses.replace(hw, memory=dataclasses.replace(
            hw.memory, total_bytes=ram, available_bytes=ram - reserve, usable_bytes=ram - reserve,
            os_reserve_bytes=reserve))
    if flavor.vcpus:
        cores = int(flavor.vcpus)
        hw = dataclasses.replace(hw, cpu=dataclasses.replace(
            hw.cpu, usable_cores=float(cores), logical_cores=cores, physical_cores=max(1, cores // 2)))
    return hw


def _default_memory_fn() -> MemoryFn:
    from trainfit.core.memory import estimate_memory

    return estimate_memory


def rank_flavors(
    req: CloudRequest,
    catalog: CloudCatalog,
    *,
    flavor_ids: list[str] | None = None,
    memory_fn: MemoryFn | None = None,
) -> CloudRanking:
    """Evaluate every usable flavor (or the ones named) for the job and rank them."""
    _check_request(req)
    memory_fn = memory_fn or _default_memory_fn()
    if req.lora is None:
        req = dataclasses.replace(req, lora=default_lora(req.model))
    flavors = [catalog.get(f) for f in flavor_ids] if flavor_ids else list(catalog.flavors)
    skipped = dict(catalog.skipped)
    cache: dict[tuple, tuple[_Best | None, float, str, float]] = {}
    results = []
    for flavor in flavors:
        if not flavor.usable:
            skipped[flavor.id] = flavor.notes or f"{flavor.kind} flavor: not for this code"
            continue
        # the host's RAM decides what offload and model loading fit, so it is part of the machine
        key = (flavor.kind, flavor.gpu, flavor.gpu_count, flavor.vcpus, flavor.ram_gib)
        if key not in cache:
            hw, rates = _hardware(flavor)
            best, ratio, why = _search(req, hw, rates, max(1, flavor.gpu_count), memory_fn)
            cap = (best.memory.devices[0].capacity_bytes if best else None) or 0
            cache[key] = (best, ratio, why, cap / GIB)
        terms = catalog.spot_terms(flavor) if req.spot else None
        results.append(_result(req, flavor, *cache[key], terms=terms))
    return _rank(req, results, skipped)


def chosen_setting(req: CloudRequest, catalog: CloudCatalog, flavor_id: str):
    """(setup, hardware, rates) of the setting the ranking chose on one flavor, or None where nothing
    fits: what `cloud --framework` measures each behaviour's effect on."""
    if req.lora is None:
        req = dataclasses.replace(req, lora=default_lora(req.model))
    flavor = catalog.get(flavor_id)
    hw, rates = _hardware(flavor)
    best, _, _ = _search(req, hw, rates, max(1, flavor.gpu_count), _default_memory_fn())
    return None if best is None else (best.setup, hw, rates)


def _spot_fields(req: CloudRequest, flavor: Flavor, best: _Best, terms: SpotTerms) -> dict:
    """The expected run on the spot machine (core.cloud.spot), with the balanced mode's cadence rule."""
    est = estimate_spot(work_seconds=best.seconds, checkpoint_size_bytes=checkpoint_bytes_for(best.setup, best.memory),
                        setup_seconds=req.setup_minutes * 60, figure=terms.interruption,
                        thresholds=safety_thresholds(None), assumed=terms.assumed)
    plain = best.seconds / 3600 + req.setup_minutes / 60
    return {"spot": est, "hours_uninterrupted": plain, "cost_usd_uninterrupted": plain * terms.usd_per_hour,
            "price_kind": "spot", "on_demand_usd_per_hour": flavor.usd_per_hour}


def _result(req: CloudRequest, flavor: Flavor, best: _Best | None, ratio: float, why: str, cap_gib: float, *,
            terms: SpotTerms | None = None) -> FlavorResult:
    price = terms.usd_per_hour if terms is not None else flavor.usd_per_hour
    note = ""
    if req.spot and terms is None:
        note = (f"no spot price for {flavor.id} in the catalog: on-demand" if flavor.spot_usd_per_hour is None
                else f"{flavor.id}: spot price without an interruption figure: on-demand")
    base = dict(
        flavor=flavor.id, provider=flavor.provider, gpu=flavor.gpu, gpu_count=flavor.gpu_count,
        usd_per_hour=price, price_source=flavor.source, price_as_of=flavor.as_of,
        memory_ratio=None if math.isinf(ratio) else ratio, spot_note=note,
    )  # fmt: skip
    if best is None:
        return FlavorResult(fits=False, why=why, **base)
    s = best.setup
    hours = best.seconds / 3600 + req.setup_minutes / 60
    extra: dict = {}
    if terms is not None:
        extra = _spot_fields(req, flavor, best, terms)
        est: SpotEstimate = extra["spot"]
        if not math.isfinite(est.expected_hours):
            why = (f"spot: {hours_text(est.interruption_hours)} between interruptions is too short for a "
                   f"{est.checkpoint_interval_seconds / 60:.0f}-min checkpoint interval and a restart: the run would "
                   "practically never finish")
            return FlavorResult(fits=False, why=why, **base, **{k: v for k, v in extra.items() if k != "spot"})
        hours = est.expected_hours + req.setup_minutes / 60
    cost = hours * (price or 0.0)
    dev = best.memory.devices[0]
    label = method_label(s)
    setting = f"{label} {s.precision} {s.micro_batch}x{s.grad_accum}" + (
        f"x{s.num_gpus}" if s.num_gpus > 1 else "") + (f" ZeRO-{s.zero_stage}" if s.zero_stage else "") + (
        f" offload {s.offload}" if s.offload != "none" else "") + (" ckpt" if s.grad_checkpointing != "none" else "")
    return FlavorResult(
        fits=True, why=setting, method=label,
        precision=s.precision, micro_batch=s.micro_batch, grad_accum=s.grad_accum, grad_checkpointing=s.grad_checkpointing,
        zero_stage=s.zero_stage, offload=s.offload, memory_gib_per_device=dev.needed_bytes / GIB,
        capacity_gib_per_device=cap_gib,
        tokens_per_second=best.tokens_per_second, bottleneck=best.bottleneck, hours=hours, cost_usd=cost,
        cost_class=cost_class(cost),
        within_budget=None if req.budget_usd is None else cost <= req.budget_usd,
        within_time=None if req.max_hours is None else hours <= req.max_hours, **base, **extra,
    )  # fmt: skip


def _ok(r: FlavorResult) -> bool:
    return r.fits and r.within_budget is not False and r.within_time is not False


def _rank(req: CloudRequest, results: list[FlavorResult], skipped: dict[str, str]) -> CloudRanking:
    def order(r: FlavorResult) -> tuple:
        if _ok(r):
            return (0, r.cost_usd, r.hours)
        if r.fits:
            return (1, r.cost_usd, r.hours)
        return (2, r.memory_ratio if r.memory_ratio is not None else math.inf, 0.0)

    ranked = sorted(results, key=order)
    ok = [r for r in ranked if _ok(r)]
    tokens = _tokens_per_epoch(req)
    reasoning: list[str] = []
    cheapest = fastest = closest = None
    if ok:
        c = min(ok, key=lambda r: (r.cost_usd, r.hours))
        f = min(ok, key=lambda r: (r.hours, r.cost_usd))
        cheapest, fastest = c.flavor, f.flavor
        limits = _limits_text(req)
        reasoning.append(f"cheapest{limits}: {c.flavor} ({c.provider}) at ${c.usd_per_hour:.2f}/h, "
                         f"{c.hours:.1f} h, ${c.cost_usd:.2f} ({c.cost_class}); setting: {c.why}")  # fmt: skip
        if f.flavor != c.flavor:
            reasoning.append(f"fastest{limits}: {f.flavor} ({f.provider}), {f.hours:.1f} h for ${f.cost_usd:.2f} "
                             f"({f.cost_usd - c.cost_usd:+.2f} vs cheapest, {c.hours / f.hours:.1f}x faster)")  # fmt: skip
        if c.method != req.method and c.method is not None:
            reasoning.append(f"{req.method} fits no cheaper flavor: the cheapest uses {c.method} instead")
        reasoning.append(f"bottleneck on {c.flavor}: {c.bottleneck}; {c.tokens_per_second:,.0f} tokens/s")
        if req.spot:
            reasoning += _spot_reasoning(c, ranked)
        recommendation = f"rent {c.flavor} ({c.provider}): ${c.cost_usd:.2f}, {c.hours:.1f} h"
        if f.flavor != c.flavor:
            recommendation += f"; for speed {f.flavor}: ${f.cost_usd:.2f}, {f.hours:.1f} h"
    else:
        fitting = [r for r in ranked if r.fits]
        if fitting:
            near = min(fitting, key=lambda r: r.cost_usd)  # type: ignore[arg-type]
            closest = near.flavor
            over = []
            if near.within_budget is False:
                over.append(f"${near.cost_usd:.2f} > budget ${req.budget_usd:.2f}")
            if near.within_time is False:
                over.append(f"{near.hours:.1f} h > limit {req.max_hours:g} h")
            reasoning.append(f"closest: {near.flavor} ({near.why}) but {' and '.join(over)}")
        elif ranked:
            near = ranked[0]
            closest = near.flavor
            reasoning.append(f"closest: {near.flavor}: {near.why}")
        recommendation = "nothing fits within the limits" if fitting else "the model fits on no flavor"
    return CloudRanking(
        model_id=req.model.id, method=req.method, tokens_per_epoch=tokens, epochs=req.workload.epochs,
        results=ranked, cheapest=cheapest, fastest=fastest, recommendation=recommendation,
        reasoning=reasoning, closest=closest, skipped=skipped, spot=req.spot,
    )  # fmt: skip


def _spot_reasoning(c: FlavorResult, ranked: list[FlavorResult]) -> list[str]:
    """Why the cheapest costs what it does on spot, and which flavors fell back to on-demand."""
    out = []
    e = c.spot
    if e is not None:
        assumed = f" (assumed: no figure published for {c.provider})" if e.assumed else ""
        wait = f"; plus ~{e.expected_wait_hours:.1f} h unbilled waiting for capacity" if e.expected_wait_hours else ""
        out.append(f"spot on {c.flavor}: {hours_text(e.interruption_hours)} between interruptions{assumed} "
                   f"[{e.interruption_basis}; {e.interruption_source}, {e.interruption_as_of}]; checkpoint every "
                   f"{e.checkpoint_interval_seconds / 60:.1f} min ({e.checkpoint_seconds:.0f} s each), restart "
                   f"{e.restart_seconds / 60:.0f} min; expected {e.expected_interruptions:.1f} interruptions, "
                   f"+{e.expected_overhead_share:.0%} for checkpoints, re-done work and restarts "
                   f"(${c.cost_usd_uninterrupted:.2f} uninterrupted -> ${c.cost_usd:.2f} expected){wait}")
    fallback = [r.flavor for r in ranked if r.spot_note]
    if fallback:
        out.append(f"{len(fallback)} flavor(s) have no spot price in the catalog and are priced on-demand")
    return out


def _limits_text(req: CloudRequest) -> str:
    parts = []
    if req.budget_usd is not None:
        parts.append(f"${req.budget_usd:g}")
    if req.max_hours is not None:
        parts.append(f"{req.max_hours:g} h")
    return f" within {' and '.join(parts)}" if parts else ""


def workload_for(req: CloudRequest, setup: TrainingSetup) -> Workload:
    """The request's data as this setting trains it: `--examples N` is N rows of the task's typical
    length distribution (core.plan.lengths), as plan and estimate size it."""
    w = req.workload
    if w.examples is None or w.dataset_tokens is not None:
        return w
    from trainfit.core.plan.lengths import examples_workload

    return examples_workload(setup, w.examples, w.epochs)


def _tokens_per_epoch(req: CloudRequest) -> int:
    w = req.workload
    if w.dataset_tokens is not None:
        return w.dataset_tokens
    from trainfit.core.plan.lengths import data_lengths, with_lengths

    setup = TrainingSetup(method=req.method if req.method != "auto" else "full", seq_len=req.seq_len)
    sized = data_lengths(with_lengths(None, setup.method, w.examples), setup)
    if sized is not None:
        return sized.epoch_tokens
    return (w.examples or 0) * req.seq_len * (2 if req.method == "dpo" else 1)


def _check_request(req: CloudRequest) -> None:
    if req.method not in TRAIN_METHODS:
        raise BadInputError(f"--method: {req.method!r} cannot be ranked for training",
                            hint=f"one of: {', '.join(TRAIN_METHODS)}")
    w = req.workload
    if w.examples is None and w.dataset_tokens is None:
        raise BadInputError("give --dataset-tokens N, or --examples N with --seq-len N")
    if (w.examples is not None and w.examples <= 0) or (w.dataset_tokens is not None and w.dataset_tokens <= 0):
        raise BadInputError("--dataset-tokens / --examples must be a positive number (got zero or less)")
    if req.seq_len <= 0:
        raise BadInputError(f"--seq-len must be positive, got {req.seq_len}")
    if w.epochs <= 0:
        raise BadInputError(f"--epochs must be positive, got {w.epochs}")
    if req.budget_usd is not None and req.budget_usd < 0:
        raise BadInputError(f"--budget must not be negative, got {req.budget_usd}")
    if req.max_hours is not None and req.max_hours <= 0:
        raise BadInputError(f"--max-hours must be positive, got {req.max_hours}")
    if req.global_batch < 1:
        raise BadInputError(f"--global-batch must be at least 1, got {req.global_batch}")
    if req.setup_minutes < 0:
        raise BadInputError(f"--setup-minutes must not be negative, got {req.setup_minutes}")
