"""The planner: three configurations per goal (conservative, balanced, extreme), each the best
setting the engine finds under the mode's targets, with its estimate, reasons and warnings.

Goals: fine-tune a given model (full / LoRA / QLoRA, SFT or DPO), pretrain from scratch (the
planner picks the size: the largest shape whose Chinchilla budget, C ~ 6 N D with D = the mode's
tokens per parameter x N, trains within the mode's time), and inference capacity (the largest
batch x context). Deterministic; no trial runs: memory and speed come from the models that the
benchmarks under bench/ check against measurements.

Where each part lives (all in core/plan/): request (PlanRequest and its checks), results (Plan,
ModePlan, RunFigures), search_space (the tiers one mode walks), mode_search (one mode's search:
ranking, memory and speed models, budget), mode_plan (the pick made a ModePlan: run figures, data
plan), plan_reasons and plan_warnings (what the plan prints under each mode), pretrain_size (the
size pretraining from scratch picks), figures_text (GiB and count formatting).
"""

from __future__ import annotations

import dataclasses

from trainfit.core.plan import lengths, measured
from trainfit.core.plan.figures_text import GIB
from trainfit.core.plan.hardware_rules import rules_for
from trainfit.core.plan.mode_plan import plan_model
from trainfit.core.plan.mode_search import capacity_bytes
from trainfit.core.plan.modes import targets
from trainfit.core.plan.pretrain_size import plan_pretrain
from trainfit.core.plan.request import PLAN_METHODS, PlanRequest, check_request
from trainfit.core.plan.results import ModePlan, Plan, RunFigures
from trainfit.errors import UnavailableError

# The library's entry: plan(PlanRequest) -> Plan. The request and result types are named here too,
# where callers have always imported them from.
__all__ = ["PLAN_METHODS", "MemoryUnknownError", "ModePlan", "Plan", "PlanRequest", "RunFigures", "check_request",
           "plan", "plan_searched"]


class MemoryUnknownError(UnavailableError):
    """The profile could not read the device's memory: no memory budget to plan within."""


def plan(req: PlanRequest) -> Plan:
    """Plan every requested mode."""
    check_request(req)
    rules = rules_for(req.hardware)
    if capacity_bytes(req, rules) is None and (req.hardware.gpus or rules.device == "cpu"):
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
            modes.append(plan_pretrain(req, t, rules))
        else:
            modes.append(plan_model(req, t, rules, req.model))  # type: ignore[arg-type]
    notes = [f"memory budget: {req.memory_budget_bytes / GIB:.2f} GiB per device imposed (--memory-budget)"] \
        if req.memory_budget_bytes else []
    from trainfit.core.speed.rates import rates_source

    rates = rates_source(req.hardware, rules.device)
    if rates["warning"]:
        notes.append(rates["warning"])
    return Plan(req.method, req.hardware.source, rules.label, modes, notes, req.hardware.memory.usable_bytes, rates)


def plan_searched(req):
    """(plan, mode -> (its model, its ranked fitting candidates)): `plan(req)` and the search behind
    each mode that fits, from the same planning (not searched a second time)."""
    with measured.recording_searches() as found:
        result = plan(req)
    searches = {mp.mode: found[(mp.mode, mp.model.id)] for mp in result.modes
                if mp.fits and mp.model is not None and (mp.mode, mp.model.id) in found}
    return result, searches
