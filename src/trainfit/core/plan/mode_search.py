"""One mode's search for one model: the tiers, the ranking, the memory and speed models (with this
machine's measured ratios and step times), and the mode's memory budget."""

from __future__ import annotations

import dataclasses
import math

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import measured
from trainfit.core.plan.engine import Budget, Candidate, SearchResult, search
from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.modes import ModeTargets
from trainfit.core.plan.request import PlanRequest
from trainfit.core.plan.search_space import mode_tiers


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


def mode_budget(req: PlanRequest, t: ModeTargets) -> Budget:
    return Budget(share=t.memory_share, bytes_override=req.memory_budget_bytes)


def predicted_speed_fn(req: PlanRequest, rules: DeviceRules):
    from trainfit.core.speed import predict_step
    from trainfit.core.speed.rates import device_rates

    rates = device_rates(req.hardware, rules.device)
    return lambda m, s: predict_step(m, s, rates)


def search_model(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec) -> SearchResult:
    from trainfit.core.speed import predict_step
    from trainfit.core.speed.rates import device_rates

    global_batch = req.target_batch or t.global_batch
    rates = device_rates(req.hardware, rules.device)  # once per search, not per candidate
    from trainfit.core.frameworks import framed_tiers

    tiers = framed_tiers(mode_tiers(req, t, rules, model, global_batch), req.framework)  # type: ignore[arg-type]
    result = search(model, req.hardware, tiers,
                     rank_key=_rank_key(t, req.method == "inference"), budget=mode_budget(req, t), rules=rules,
                     speed_fn=measured.speed_fn(req, model, lambda m, s: predict_step(m, s, rates)),
                     memory_fn=_memory_fn(req, rules))
    if t.largest_micro_batch and req.method != "inference":
        result = _largest_batch_near_fastest(result)
    return measured.pinned(req, t.mode, model, result)


def capacity_bytes(req: PlanRequest, rules: DeviceRules) -> int | None:
    from trainfit.core.memory.overheads import cpu_capacity, gpu_capacity

    if req.memory_budget_bytes is not None:
        return req.memory_budget_bytes
    return cpu_capacity(req.hardware) if rules.device == "cpu" else gpu_capacity(req.hardware)
