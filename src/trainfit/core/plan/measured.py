"""Step times measured on this machine, fed back into the planner as data.

`trainfit plan` for the machine it runs on lets a probe (trainfit.train.probe) run a few real
steps of the settings the speed model cannot tell apart, and hands the measured seconds back here.
The planner stays pure: it never measures, it only ranks with what it is given:

  - a measured setting ranks by its measured step time;
  - an unmeasured setting of a measured *kernel class* (method, precision, attention kernel,
    checkpointing, optimizer, adapters, quantisation: the knobs whose cost the speed model models
    per kernel, where its errors are systematic) ranks by its prediction times that class's
    median measured / predicted ratio, so the micro-batch axis still comes from the model;
  - any other setting ranks by its prediction, scaled down by the smallest measured ratio when
    that is below 1 (the machine is faster than the model everywhere), never up (unmeasured_factor).

`shortlist` names the settings a probe should measure next: the unmeasured ones whose step time
could, within the speed model's error, beat the best one. Empty means the pick is confirmed.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from trainfit.core.model_spec import ModelSpec
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.types import SpeedEstimate

# Relative error of the speed model when it compares two settings of one model on one machine.
# bench/results/plan_quality.md (this CPU, 40 settings measured): gradient checkpointing predicted
# 0.76x vs 0.75x measured, eager vs sdpa attention 0.84x vs 0.94x (11 %), the best micro-batch's
# measured share of the best 93-100 %; round-to-round noise of one measurement 17 % (median). Two
# predictions a and b can swap when a (1 - e) < b (1 + e): the band below.
SPEED_MODEL_ERROR = 0.15
BAND = (1 + SPEED_MODEL_ERROR) / (1 - SPEED_MODEL_ERROR)
# Settings measured per round: the best of each kernel class in the band first, then the rest.
ROUND_SIZE = 4


@dataclass(frozen=True)
class MeasuredStep:
    """One setting's optimizer step measured by the probe (seconds, on this machine)."""

    model_id: str
    setup: TrainingSetup
    step_seconds: float
    predicted_step_seconds: float  # what the planner predicted for it when it was measured
    lower_bound: bool = False  # stopped before it finished: at least this slow
    source: str = "probe"  # "probe" (this plan) or "stored" (an earlier plan's probe)


@dataclass(frozen=True)
class SpeedSkew:
    """Test hook: multiply the predicted step time of every setting whose `knob` is `value`
    (a speed model deliberately wrong about one precision or attention kernel)."""

    knob: str  # a TrainingSetup field: "precision", "attention", "grad_checkpointing", ...
    value: str
    factor: float


def kernel_class(s: TrainingSetup) -> tuple:
    """The knobs whose cost the speed model models per kernel (precision, attention kernel,
    checkpointing, optimizer, adapters, quantisation, sharding): one class shares one error. Only
    the exact class is scaled: a coarser one would carry one knob's error onto the other value of
    another knob (a wrong checkpointing figure onto settings without checkpointing)."""
    return (s.method, s.precision, s.attention, s.grad_checkpointing, s.optimizer, s.lora is not None, s.quant,
            s.zero_stage, s.offload, s.num_gpus)


def skew_factor(skews: tuple, s: TrainingSetup) -> float:
    f = 1.0
    for sk in skews:
        if str(getattr(s, sk.knob, None)) == sk.value:
            f *= sk.factor
    return f


def _measured(steps: tuple, model_id: str) -> dict[TrainingSetup, MeasuredStep]:
    return {m.setup: m for m in steps if m.model_id == model_id}


def class_ratios(steps: tuple, model_id: str) -> dict[tuple, float]:
    """Median measured / predicted step time per kernel class. A lower bound counts as measured:
    the class is at least that slow, which is what ranking it needs."""
    by_class: dict[tuple, list[float]] = {}
    for m in _measured(steps, model_id).values():
        if m.predicted_step_seconds > 0:
            by_class.setdefault(kernel_class(m.setup), []).append(m.step_seconds / m.predicted_step_seconds)
    return {k: statistics.median(v) for k, v in by_class.items()}


def adjusted_step(req, model_id: str, s: TrainingSetup, predicted_seconds: float, *,
                  measured: dict | None = None, ratios: dict | None = None) -> tuple[float, str]:
    """(seconds, how) of one setting: how is "measured", "class" (scaled by its class's measured
    ratio) or "predicted" (the prediction with the skew hook, see unmeasured_factor). `measured` and
    `ratios` are the request's, computed here unless the caller (a search) computed them once."""
    if measured is None:
        measured = _measured(req.measured_steps, model_id)
    if s in measured:
        m = measured[s]
        if m.lower_bound and req.measured_settle:
            # Only "at least this slow": the final pick must not rest on it unless it wins by the
            # speed model's whole error band.
            return m.step_seconds * BAND, "measured"
        return m.step_seconds, "measured"
    planner_seconds = predicted_seconds * skew_factor(req.speed_skew, s)
    if ratios is None:
        ratios = class_ratios(req.measured_steps, model_id)
    ratio = ratios.get(kernel_class(s))
    if ratio is not None:
        return planner_seconds * ratio, "class"
    return planner_seconds * unmeasured_factor(ratios, settle=req.measured_settle), "predicted"


def unmeasured_factor(ratios: dict[tuple, float], *, settle: bool = False) -> float:
    """The scale of a setting whose class nobody measured, against measured ones.

    While the probe still measures: the smallest measured ratio when it is below 1 (the machine
    runs faster than the model says, and that shows in every class), else 1. Never above 1: a class
    measured slower than predicted may be that class's own error (a kernel the model is wrong
    about), which says nothing of the others, so an unmeasured class gets the benefit of the doubt
    and is measured when it comes near the best.

    The final plan (`settle`): the median measured ratio, the typical error of this machine. When
    the probe's time ran out with classes unmeasured, an unmeasured setting then has to beat the
    measured ones by the typical error, not by the most favourable one (once the probe finished,
    nothing unmeasured is near the pick either way, so the pick is the same)."""
    if not ratios:
        return 1.0
    if settle:
        return statistics.median(ratios.values())
    return min(1.0, min(ratios.values()))


def active(req) -> bool:
    return bool(req.measured_steps or req.speed_skew)


def speed_fn(req, model: ModelSpec, base: Callable[[ModelSpec, TrainingSetup], SpeedEstimate]):
    """The planner's speed function with the measurements and the skew hook applied."""
    if not active(req):
        return base
    # the request's measurements, once per search rather than per candidate
    measured = _measured(req.measured_steps, model.id)
    ratios = class_ratios(req.measured_steps, model.id)

    def fn(m: ModelSpec, s: TrainingSetup) -> SpeedEstimate:
        from trainfit.core.run_prediction import _scaled

        speed = base(m, s)
        if m.id == model.id:
            seconds, _ = adjusted_step(req, m.id, s, speed.step_seconds, measured=measured, ratios=ratios)
        else:
            seconds, _ = adjusted_step(req, m.id, s, speed.step_seconds)
        return _scaled(speed, seconds / speed.step_seconds) if speed.step_seconds > 0 else speed
    return fn


def predict_run(req, model: ModelSpec, s: TrainingSetup, workload):
    """core.run_prediction.predict_run for the plan's pick, at its measured (or class-scaled) step
    time when the probe measured it: the figures then say what this machine does."""
    from trainfit.core.power import estimate_power
    from trainfit.core.run_prediction import RunPrediction, _scaled, predict_run as predict
    from trainfit.core.speed import predict_step

    if not active(req):
        return predict(model, s, req.hardware, workload, price_per_kwh=req.price_per_kwh,
                       step_time_factor=req.step_time_factor, calibration_source=req.calibration_source)
    base = predict(model, s, req.hardware, workload, price_per_kwh=req.price_per_kwh)
    raw = predict_step(model, s, req.hardware).step_seconds
    seconds, how = adjusted_step(req, model.id, s, raw)
    if how == "predicted" and not req.speed_skew:
        return predict(model, s, req.hardware, workload, price_per_kwh=req.price_per_kwh,
                       step_time_factor=req.step_time_factor, calibration_source=req.calibration_source)
    factor = seconds / raw if raw > 0 else 1.0
    speed = _scaled(base.speed, factor)
    note = {"measured": f"step time measured on this machine by the plan's probe ({seconds:.3g} s, "
                        f"x{factor:.2f} the speed model)",
            "class": f"step time x{factor:.2f}: the speed model scaled by the probe's measured ratio for this "
                     "precision / attention / checkpointing",
            "predicted": f"step time x{factor:.2f} (speed-model skew test hook)"}[how]
    return RunPrediction(speed, estimate_power(req.hardware, speed, price_per_kwh=req.price_per_kwh), factor,
                         [*base.notes, note])


@dataclass(frozen=True)
class ProbeCandidate:
    model: ModelSpec
    setup: TrainingSetup
    predicted_step_seconds: float  # the planner's figure (skew hook included, no measurement)
    modes: tuple[str, ...]  # the modes whose band it is in


def shortlist(req, results: dict[str, tuple[ModelSpec, list]]) -> list[ProbeCandidate]:
    """The unmeasured settings to measure next, best first: per mode, those whose step time lies
    within BAND of the mode's best (measured or not). `results`: mode -> (model, ranked fitting
    candidates, as the search returned them). At most ROUND_SIZE, one per kernel class first."""
    from trainfit.core.speed import predict_step

    found: dict[tuple[str, TrainingSetup], dict] = {}
    for mode, (model, fitting) in results.items():
        timed = [c for c in fitting if c.speed is not None]
        if not timed:
            continue
        best = min(c.speed.step_seconds for c in timed)
        measured = _measured(req.measured_steps, model.id)
        for c in timed:
            if c.speed.step_seconds > best * BAND or c.setup in measured:
                continue
            if c.setup.method == "inference" or c.setup.num_gpus > 1:
                continue  # one process, one device: what a probe can run
            key = (model.id, c.setup)
            entry = found.setdefault(key, {"model": model, "setup": c.setup, "at": c.speed.step_seconds, "modes": []})
            entry["modes"].append(mode)
    ordered = sorted(found.values(), key=lambda e: e["at"])
    firsts, rest, classes = [], [], set()
    for e in ordered:
        k = (e["model"].id, kernel_class(e["setup"]))
        (rest if k in classes else firsts).append(e)
        classes.add(k)
    out = []
    for e in (firsts + rest)[:ROUND_SIZE]:
        planner_seconds = predict_step(e["model"], e["setup"], req.hardware).step_seconds \
            * skew_factor(req.speed_skew, e["setup"])
        out.append(ProbeCandidate(e["model"], e["setup"], planner_seconds, tuple(e["modes"])))
    return out


def with_measurements(req, steps) -> object:
    """The request with more measured steps (later ones replace earlier ones of the same setting)."""
    keep = {(m.model_id, m.setup): m for m in (*req.measured_steps, *steps)}
    return dataclasses.replace(req, measured_steps=tuple(keep.values()))


def mode_searches(req, plan) -> dict[str, tuple[ModelSpec, list]]:
    """mode -> (its model, its ranked fitting candidates): the searches behind `plan`'s picks."""
    from trainfit.core.plan.hardware_rules import rules_for
    from trainfit.core.plan.modes import targets
    from trainfit.core.plan.planner import _search_model

    rules = rules_for(req.hardware)
    out = {}
    for mp in plan.modes:
        if not mp.fits or mp.model is None:
            continue
        t = targets(mp.mode, memory_share=req.memory_share, tokens_per_param=req.tokens_per_param,
                    hours_max=req.time_budget_hours)
        r = req if mp.setup is None or mp.setup.method != "pretrain" else dataclasses.replace(req, method="pretrain")
        out[mp.mode] = (mp.model, _search_model(r, t, rules, mp.model).fitting)
    return out
