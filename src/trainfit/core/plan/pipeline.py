"""A training pipeline planned phase by phase: pretraining -> SFT, SFT -> DPO, or all three.

Each phase is one planner run (trainfit.core.plan.planner.plan) with its own method, precision,
batch and time per mode; this module adds what joins them (docs/pipeline.md):

- the hand-off: a phase starts from the previous phase's output. LoRA adapters of the previous
  phase are merged into its base first (HAND_OFF_ADAPTERS); full weights are loaded as saved.
- the DPO reference model and how it is held: with LoRA the policy with its adapter disabled
  (no extra copy: the memory model counts none), with full weights a frozen copy (the memory
  model's `reference_model` component, part of the phase's memory verdict).
- token budgets: pretraining from the mode's tokens per parameter (the planner's Chinchilla
  budget), fine-tuning from examples x seq_len x epochs (DPO: pairs x 2 sequences), and all of it
  capped by the mode's time budget, which holds for the whole pipeline: when the phases together
  need longer, every phase trains the same share of its data (the cap is reported).
- totals: time, energy, electricity and rental cost summed over the phases.

Pure: no I/O, no printing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trainfit.core.plan.planner import ModePlan, PlanRequest, RunFigures, plan
from trainfit.core.durations import hours_text
from trainfit.core.setup import SFT_METHODS
from trainfit.errors import BadInputError

# name -> phases in order. A phase's name is also its method family: pretrain, sft, dpo.
PIPELINES: dict[str, tuple[str, ...]] = {
    "sft+dpo": ("sft", "dpo"),
    "pretrain+sft": ("pretrain", "sft"),
    "pretrain+sft+dpo": ("pretrain", "sft", "dpo"),
}
# Adapters of a LoRA phase are merged into its base before the next phase (the only hand-off
# built): the next phase then starts from one plain model, and a DPO phase's reference (its
# starting model with its own adapter disabled) is the previous phase's model, as DPO needs
# (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290 §4: pi_ref = pi_SFT). A stacked
# adapter would leave the reference at the bare base: disabling adapters disables phase A's too.
HAND_OFF_ADAPTERS = "merge"
# --method of the SFT phase: "auto" falls back full -> LoRA -> QLoRA as the planner does.
SFT_PHASE_METHODS = ("auto", *SFT_METHODS)
# Settings the planner may choose that the run config cannot express yet: DPO on a 4-bit base
# (the planner's "dpo+qlora" variant; a run config's training.quant is for method qlora only).
@dataclass(frozen=True)
class PipelineRequest:
    pipeline: str  # a key of PIPELINES
    base: PlanRequest  # hardware, model, seq_len, target batch, epochs, budgets, modes, calibration
    sft_method: str = "auto"  # SFT_PHASE_METHODS (the planner falls back full -> LoRA -> QLoRA as usual)
    examples: int | None = None  # SFT examples (default: the DPO pairs' chosen answers)
    pairs: int | None = None  # DPO preference pairs (default: the SFT examples)
    pretrain_tokens: int | None = None  # pretraining tokens (default: the mode's tokens per parameter)


@dataclass(frozen=True)
class PhasePlan:
    name: str  # pretrain | sft | dpo
    plan: ModePlan  # the planner's mode, with `run` capped when the time budget caps it
    request: PlanRequest  # what the phase was planned with (the exporters take it)
    start_from: str | None  # the previous phase, whose output this phase loads
    adapters: str | None  # HAND_OFF_ADAPTERS when start_from trains LoRA adapters, else None
    reference: str | None  # DPO: how the reference model is held
    reference_bytes: int  # DPO: memory the reference adds on the busiest device (0: none held)
    token_basis: str  # how the phase's token budget was set
    uncapped: RunFigures | None  # the run before the time cap (None: no cap applied)


@dataclass(frozen=True)
class PipelineTotals:
    hours: float | None
    energy_kwh: float | None
    electricity_cost: float | None
    rental_usd: float | None
    tokens: int | None
    steps: int | None


@dataclass(frozen=True)
class PipelineMode:
    mode: str
    fits: bool  # every phase fits
    phases: list[PhasePlan]
    totals: PipelineTotals
    hours_max: float  # the mode's time budget for the whole pipeline
    capped_share: float | None  # share of each phase's data that fits the time budget (None: all)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: str
    hardware: str
    device: str
    model_id: str
    modes: list[PipelineMode]
    notes: list[str] = field(default_factory=list)
    rates: dict | None = None  # the speed rates used and when they were measured (speed.rates.rates_source)


def check_pipeline_request(req: PipelineRequest) -> None:
    problems = []
    if req.pipeline not in PIPELINES:
        problems.append(f"--pipeline: {req.pipeline!r} is not one of {', '.join(PIPELINES)}")
    elif PIPELINES[req.pipeline][0] == "pretrain":
        m = req.base.model
        if m is not None and m.source != "shape":
            problems.append(f"--pipeline {req.pipeline}: pretraining starts from random weights, so MODEL must be a "
                            f"shape (shape:125m) or omitted (the planner sizes it); {m.id} is a pretrained model: "
                            "plan --pipeline sft+dpo for it")
    elif req.base.model is None:
        problems.append(f"MODEL missing: --pipeline {req.pipeline} fine-tunes a given model (catalog id, local "
                        "config.json)")
    if req.sft_method not in SFT_PHASE_METHODS:
        problems.append(f"--method: {req.sft_method!r} is not a method for the SFT phase of a pipeline "
                        f"(valid: {', '.join(SFT_PHASE_METHODS)})")
    if req.pipeline in PIPELINES and "dpo" not in PIPELINES[req.pipeline] and req.pairs is not None:
        problems.append(f"--pairs: pipeline {req.pipeline} has no DPO phase (valid: sft+dpo, pretrain+sft+dpo)")
    if req.base.dataset_tokens is not None and req.pipeline in PIPELINES and "pretrain" not in PIPELINES[req.pipeline]:
        problems.append("--dataset-tokens: sizes a pretraining phase; give the SFT set with --examples and the DPO "
                        "set with --pairs")
    if problems:
        raise BadInputError("; ".join(problems))


def plan_pipeline(req: PipelineRequest) -> PipelinePlan:
    """Every phase planned per mode, joined by their hand-offs, with the totals."""
    check_pipeline_request(req)
    names = PIPELINES[req.pipeline]
    # Each phase gets its own data size below; a measured dataset describes one phase's data, not all.
    clear = {"dataset": None} if hasattr(req.base, "dataset") else {}
    base = dataclasses.replace(req.base, examples=None, dataset_tokens=None, **clear)
    sft_examples = req.examples if req.examples is not None else req.pairs
    dpo_pairs = req.pairs if req.pairs is not None else req.examples
    notes = []
    if "sft" in names and "dpo" in names and req.examples is None and req.pairs is not None:
        notes.append(f"SFT examples: {req.pairs:,}, the preference pairs' chosen answers (DPO's practice when no "
                     "separate SFT set exists, Rafailov et al. 2023 §4); give --examples for another SFT set")
    if "sft" in names and "dpo" in names and req.pairs is None and req.examples is not None:
        notes.append(f"DPO pairs: {req.examples:,}, as many as the SFT examples; give --pairs for the real count")
    per_mode: dict[str, list[tuple[str, ModePlan, PlanRequest]]] = {m: [] for m in base.modes}
    device = hardware = ""
    for i, name in enumerate(names):
        if name == "pretrain":
            results = _plan_pretrain(base, req.pretrain_tokens)
        else:
            method = req.sft_method if name == "sft" else "dpo"
            count = sft_examples if name == "sft" else dpo_pairs
            results = _plan_fine_tune(base, method, count, per_mode if i else None)
        for mode, (mp, preq, dev, hw) in results.items():
            per_mode[mode].append((name, mp, preq))
            if dev:
                device, hardware = dev, hw
    modes = [_join(req, mode, phases) for mode, phases in per_mode.items()]
    model_id = modes[0].phases[0].plan.model_id if modes and modes[0].phases else "-"
    from trainfit.core.plan.hardware_rules import rules_for
    from trainfit.core.speed.rates import rates_source

    rates = rates_source(base.hardware, rules_for(base.hardware).device)
    if rates["warning"]:
        notes.append(rates["warning"])
    return PipelinePlan(req.pipeline, hardware, device, model_id, modes, notes, rates)


# ---------------------------------------------------------------------------------------------
def _plan_pretrain(base: PlanRequest, tokens: int | None) -> dict[str, tuple]:
    """The pretraining phase: the planner's size and Chinchilla budget when no shape is given;
    for a given shape, the mode's tokens per parameter x its parameters (or the given tokens)."""
    req = dataclasses.replace(base, method="pretrain", dataset_tokens=tokens)
    first = plan(req)
    out = {}
    for mp in first.modes:
        if base.model is not None and tokens is None and mp.fits and mp.params_total:
            budget = int(mp.targets.tokens_per_param * mp.params_total)
            again = plan(dataclasses.replace(req, dataset_tokens=budget, modes=(mp.mode,)))
            mp = again.modes[0]
            mp = dataclasses.replace(mp, reasons=[f"token budget: {mp.targets.tokens_per_param:g} tokens/parameter x "
                                                  f"{mp.params_total:,} parameters = {budget:,} tokens", *mp.reasons])
            out[mp.mode] = (mp, dataclasses.replace(req, dataset_tokens=budget, modes=(mp.mode,)), first.device,
                            first.hardware)
        else:
            out[mp.mode] = (mp, dataclasses.replace(req, modes=(mp.mode,)), first.device, first.hardware)
    return out


def _plan_fine_tune(base: PlanRequest, method: str, count: int | None,
                    earlier: dict[str, list[tuple[str, ModePlan, PlanRequest]]] | None) -> dict[str, tuple]:
    """SFT or DPO on the model the previous phase leaves (the same architecture as its start; a
    pretraining phase chose the shape per mode, so then each mode is planned on its own)."""
    req = dataclasses.replace(base, method=method, examples=count)
    shapes = {mode: phases[0][1].model for mode, phases in (earlier or {}).items()
              if phases and phases[0][0] == "pretrain"}
    if not shapes:
        p = plan(req)
        return {mp.mode: (mp, dataclasses.replace(req, modes=(mp.mode,)), p.device, p.hardware) for mp in p.modes}
    out = {}
    for mode in base.modes:
        spec = shapes.get(mode)
        one = dataclasses.replace(req, modes=(mode,), model=spec if spec is not None else base.model)
        if one.model is None:  # the pretraining phase found no size: nothing to fine-tune
            out[mode] = (None, one, "", "")
            continue
        p = plan(one)
        out[mode] = (p.modes[0], one, p.device, p.hardware)
    return out


def _reference(mp: ModePlan) -> tuple[str | None, int]:
    s = mp.setup
    if s is None or s.method != "dpo":
        return None, 0
    held = 0
    if mp.memory is not None:
        held = max((c.bytes for d in mp.memory.devices for c in d.components if c.name == "reference_model"),
                   default=0)
    if s.dpo_reference == "lora-base":
        return ("the policy with its LoRA adapter disabled: the phase's starting model, no extra copy held", held)
    if s.dpo_reference == "precomputed":
        return ("reference log-probabilities computed before training: no reference model held", held)
    return (f"a frozen copy of the phase's starting model, {held / 2**30:.2f} GiB on the busiest device "
            "(counted in the memory estimate)", held)


def _token_basis(name: str, mp: ModePlan, req: PlanRequest) -> str:
    s = mp.setup
    if name == "pretrain":
        if mp.pretrain is not None:
            return (f"pretraining: {mp.pretrain['tokens_per_param']:g} tokens/parameter x "
                    f"{mp.pretrain['params']:,} parameters (the mode's Chinchilla ratio)")
        if req.dataset_tokens is not None:
            return f"pretraining: {req.dataset_tokens:,} tokens"
        return "pretraining: no token budget (no size fits)"
    if s is None or mp.run is None or mp.run.tokens is None:
        return f"{name}: no data size given (--examples / --pairs)"
    what = "pairs x 2 sequences" if s.method == "dpo" else "examples"
    sized = mp.data_lengths
    if sized is None:
        return (f"{name}: {req.examples:,} {what} x {s.seq_len} tokens x {req.epochs:g} epochs "
                "(every example counted at the full sequence length: an upper bound)")
    return (f"{name}: {sized.rows:,} {what}, {sized.epoch_tokens:,} tokens per epoch at seq {s.seq_len} "
            f"(cut at seq: {sized.truncated_share:.0%} of the sequences) x {req.epochs:g} epochs")


def _join(req: PipelineRequest, mode: str, phases: list[tuple[str, ModePlan | None, PlanRequest]]) -> PipelineMode:
    from trainfit.core.plan.modes import targets

    t = targets(mode, hours_max=req.base.time_budget_hours)
    reasons: list[str] = []
    warnings: list[str] = []
    fits = all(mp is not None and mp.fits for _, mp, _ in phases)
    hours = [mp.run.hours if mp is not None and mp.run is not None else None for _, mp, _ in phases]
    share, cap_why, cap_kind = None, "", "time"
    if fits and all(h is not None for h in hours):
        total = sum(hours)  # type: ignore[arg-type]
        if total > t.hours_max:
            share = t.hours_max / total
            cap_why = f"the phases need {hours_text(total)} together, over {mode}'s {hours_text(t.hours_max)}"
            warnings.append(f"time budget: {cap_why}: each phase trains {share:.0%} of its data (its max_steps cut "
                            "to match); raise --time-budget, or give fewer examples / epochs")
        spent = _sum([mp.run.rental_usd if mp is not None and mp.run is not None else None for _, mp, _ in phases])
        budget = req.base.budget_usd
        if budget is not None and spent is not None and spent > budget:
            by_cost = budget / spent
            if share is None or by_cost < share:
                share, cap_kind = by_cost, "budget"
                cap_why = f"the phases cost ${spent:,.2f} together, over the ${budget:g} budget"
                warnings.append(f"cost budget: {cap_why}: each phase trains {share:.0%} of its data (its max_steps "
                                "cut to match)")
    out: list[PhasePlan] = []
    prev: ModePlan | None = None
    for i, (name, mp, preq) in enumerate(phases):
        if mp is None:
            break
        uncapped = None
        alone = getattr(getattr(mp, "data_io", None), "budget", None)  # the single-run plan's own cut, if any
        if share is not None and mp.run is not None and mp.run.steps:
            uncapped = mp.run
            mp = _capped_plan(mp, share, cap_why, cap_kind)
        elif alone is not None and alone.capped_by and alone.steps and mp.run is not None and mp.run.steps \
                and alone.steps < mp.run.steps:
            # the run config trains the data plan's steps: the figures follow them
            uncapped = mp.run
            mp = dataclasses.replace(mp, run=_with_steps(mp.run, alone.steps))
        ref, ref_bytes = _reference(mp)
        start = phases[i - 1][0] if i else None
        adapters = HAND_OFF_ADAPTERS if prev is not None and prev.setup is not None and prev.setup.lora is not None \
            else None
        out.append(PhasePlan(name, mp, preq, start, adapters, ref, ref_bytes, _token_basis(name, mp, preq), uncapped))
        if start is not None:
            reasons.append(f"{name} starts from {start}'s output" + (
                ": its LoRA adapter merged into the base first (merge_and_unload)" if adapters else
                " (full weights, loaded as saved)"))
        if ref is not None:
            reasons.append(f"{name} reference model: {ref}")
        prev = mp
    if not fits:
        bad = [name for name, mp, _ in phases if mp is None or not mp.fits]
        warnings.append(f"phase(s) {', '.join(bad)} do not fit this mode's memory budget: the pipeline does not run "
                        "in this mode")
    return PipelineMode(mode, fits, out, _totals(out) if fits else PipelineTotals(None, None, None, None, None, None),
                        t.hours_max, share, reasons, warnings)


def _capped_plan(mp: ModePlan, share: float, why: str, kind: str) -> ModePlan:
    """The phase with its run cut to `share`; the single-run data plan's token budget (which the
    run-config exporter takes max_steps from) says the same, with the pipeline's reason."""
    run = _capped(mp.run, share)  # type: ignore[arg-type]
    dp = getattr(mp, "data_io", None)
    budget = getattr(dp, "budget", None)
    if budget is None:
        return dataclasses.replace(mp, run=run)
    reason = (f"token budget cut to {run.tokens:,} tokens ({run.steps:,} steps), {share:.0%} of the phase's data: "
              f"{why}")
    kept = run.steps / mp.run.steps  # type: ignore[operator,union-attr]
    epochs = None if budget.epochs is None else budget.epochs * kept
    budget = dataclasses.replace(budget, tokens=run.tokens, steps=run.steps, capped_by=kind, epochs=epochs)
    dp = dataclasses.replace(dp, budget=budget, reasons={**dp.reasons, "budget": reason})
    return dataclasses.replace(mp, run=run, data_io=dp)


def _capped(run: RunFigures, share: float) -> RunFigures:
    """The run cut to `share` of its steps (whole steps, at least one)."""
    return _with_steps(run, max(1, int(math.floor(run.steps * share))))  # type: ignore[operator]


def _with_steps(run: RunFigures, steps: int) -> RunFigures:
    """The run cut to `steps`; time, energy and cost scale with the steps kept."""
    kept = steps / run.steps  # type: ignore[operator]

    def scale(x):
        return None if x is None else x * kept

    tokens = None if run.tokens is None else int(run.tokens * kept)
    out = dataclasses.replace(run, tokens=tokens, steps=steps, hours=scale(run.hours), energy_kwh=scale(run.energy_kwh),
                              electricity_cost=scale(run.electricity_cost), rental_usd=scale(run.rental_usd))
    if getattr(run, "rental_expected_usd", None) is not None:  # spot: the expected rental scales the same way
        out = dataclasses.replace(out, rental_expected_usd=scale(run.rental_expected_usd))
    return out


def _sum(values: list) -> float | None:
    return None if any(v is None for v in values) else sum(values)


def _totals(phases: list[PhasePlan]) -> PipelineTotals:
    runs = [p.plan.run for p in phases]
    if any(r is None for r in runs):
        return PipelineTotals(None, None, None, None, None, None)

    def total(key: str):
        return _sum([getattr(r, key) for r in runs])

    tokens, steps = total("tokens"), total("steps")
    return PipelineTotals(total("hours"), total("energy_kwh"), total("electricity_cost"), total("rental_usd"),
                          None if tokens is None else int(tokens), None if steps is None else int(steps))
