"""One mode for a given model: its search's pick with the run it makes (steps, hours, energy, cost,
the data plan), the reasons and the warnings, as a ModePlan."""

from __future__ import annotations

import dataclasses
import math

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import data_io, lengths, measured
from trainfit.core.plan.data_io import DataPlan
from trainfit.core.plan.engine import SearchResult
from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.mode_search import capacity_bytes, mode_budget, search_model
from trainfit.core.plan.modes import ModeTargets
from trainfit.core.plan.plan_reasons import length_reasons, setting_reasons, shorter_seq_reasons
from trainfit.core.plan.plan_warnings import (moe_quant_warning, setting_warnings, shorter_seq_advice,
                                              truncation_warnings)
from trainfit.core.plan.request import PlanRequest
from trainfit.core.plan.results import ModePlan, RunFigures
from trainfit.core.plan.spot_figures import plan_figures
from trainfit.core.run.power import PowerEstimate
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.types import SpeedEstimate, Workload


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


def plan_model(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec,
               result: SearchResult | None = None, pretrain_tokens: int | None = None,
               pretrain: dict | None = None, extra_reasons: list[str] | None = None,
               extra_warnings: list[str] | None = None) -> ModePlan:
    result = result or search_model(req, t, rules, model)
    measured.note_search(t.mode, model, result)  # the probe reads the search behind each pick
    budget = mode_budget(req, t)
    cap = capacity_bytes(req, rules)
    reasons = list(extra_reasons or [])
    warnings = list(extra_warnings or []) + moe_quant_warning(req, rules, model, result)
    if result.best is None:
        need = result.smallest_need_ratio
        why = "; ".join(f"{k}: {v}" for k, v in result.rejected.items()) or "nothing could be evaluated"
        warnings.append(f"nothing fits {t.memory_share:.0%} of the usable memory ({why})")
        if math.isfinite(need):
            warnings.append(f"the closest setting needs {need:.2f}x this mode's memory budget: use a larger "
                            "GPU (trainfit cloud), more GPUs, or a smaller model")
        if req.method != "inference":
            warnings += shorter_seq_advice(req, t, rules, model)
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
        run, spot_reasons, spot_warnings = plan_figures(req.spot, t.mode, s, best.memory, run, req.budget_usd)
        warnings += spot_warnings
    reasons += setting_reasons(model, req, t, rules, result, best, budget, cap) + run_pred.notes + spot_reasons
    reasons += shorter_seq_reasons(req, t, model, s, sized) + length_reasons(sized, s, data_plan.packing if data_plan else None)
    warnings += truncation_warnings(sized, s)
    warnings += setting_warnings(req, t, rules, s, speed, power, asked_hours, rental, best, budget.limit(cap))
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
