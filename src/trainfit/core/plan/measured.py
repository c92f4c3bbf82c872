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
could, within the speed model's error and the measurements' noise, beat the best one, and the best
one's split neighbours (the same setting with the micro-batch halved or doubled at the same global
batch), whatever their prediction: a class ratio cannot correct the micro-batch axis, and on a CPU
the best split depends on caches the model does not see (bench/results/plan_quality_probe.md: the
best measured settings were mb4x4 and mb8x2, the model's mb16x1 at 84 % of them). Empty means the
pick is confirmed.

Checkpointing only adds work: a checkpointed setting whose checkpoint-free twin fits is shortlisted
last, and once the twin is measured it ranks at least as slow and is not measured; once the twin's
kernel class is measured, at least at the twin's class-scaled prediction (twin_floor).

A measurement is noisy (another process takes a core, a cold first setting faults its pages in):
each carries its spread, and the probe measures the finalists (the speed model's pick and a setting
measured faster) again, interleaved, before `decide` judges them: measured again, the faster by more
than a tie (MIN_SPREAD) wins, whatever the speed model said; measured once, only by more than the
spread of the two. A kept pick is pinned (`measured_pins`, `pinned`) so the final plan ranks it first.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from trainfit.core.models.spec import ModelSpec
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
# The smallest difference that moves a pick off the speed model's (the margin of a tie): two settings
# a few per cent apart are equivalent for a run (and the benchmark's 95 % verdict).
MIN_SPREAD = 0.03
# A measured pick this much faster than the speed model's (or less) is measured again, both
# interleaved, before it replaces it: on a busy machine the same setting measured twice differed by
# 24 % (median) and up to 50 % (bench/results/plan_quality_probe.md), beyond what one measurement's
# own spread shows. A larger gap (a kernel class the model is wrong about) needs no second look.
RECHECK_GAP = 0.5
# The mode whose candidates the probe measures first.
PRIMARY_MODE = "balanced"


@dataclass(frozen=True)
class MeasuredStep:
    """One setting's optimizer step measured by the probe (seconds, on this machine)."""

    model_id: str
    setup: TrainingSetup
    step_seconds: float
    predicted_step_seconds: float  # what the planner predicted for it when it was measured
    lower_bound: bool = False  # stopped before it finished: at least this slow
    source: str = "probe"  # "probe" (this plan) or "stored" (an earlier plan's probe)
    # Relative noise of step_seconds: each measurement's own spread (of its timed micro-batches,
    # train.probe.micro_spread) and, measured again, how far the measurements disagree (repeat_spread).
    spread: float = 0.0
    samples: tuple[float, ...] = ()  # each measurement's step seconds (step_seconds is their median)
    sample_spreads: tuple[float, ...] = ()  # each measurement's own spread

    @property
    def repeats(self) -> int:
        return max(1, len(self.samples))


def pooled(old: MeasuredStep, new: MeasuredStep) -> MeasuredStep:
    """One setting measured again in the same probe: its figure (pooled_seconds) and spread.
    A complete measurement replaces an "at least this slow" one; another plan's (stored) is replaced."""
    if old.source != new.source or old.lower_bound and not new.lower_bound:
        return new
    if new.lower_bound:
        return old if not old.lower_bound or old.step_seconds >= new.step_seconds else new
    samples = (*(old.samples or (old.step_seconds,)), *(new.samples or (new.step_seconds,)))
    own = (*(old.sample_spreads or (old.spread,) * len(old.samples or (0,))),
           *(new.sample_spreads or (new.spread,) * len(new.samples or (0,))))
    return dataclasses.replace(old, step_seconds=pooled_seconds(samples), samples=samples, sample_spreads=own,
                               spread=repeat_spread(samples, own))


def pooled_seconds(samples: tuple[float, ...]) -> float:
    """A setting's step time from its measurements: the faster of two, the median of three or more.
    A machine's noise only ever slows a measurement (another process takes a core, a cold first
    setting still faults its pages in), so of two the faster is the nearer the setting's own speed:
    the same 6 x 256 setting measured 0.854 s cold and 0.666 s warm, against 0.65-0.67 s in five
    later measurements (bench/results/plan_quality_probe.md). Of three, the median is as robust to one
    slow one and not biased fast."""
    return min(samples) if len(samples) <= 2 else statistics.median(samples)


def repeat_spread(samples: tuple[float, ...], own: tuple[float, ...] = ()) -> float:
    """The spread of a setting measured several times: the larger of how far the measurements
    disagree and of their own spreads. Two: their range and the larger own spread; three or more:
    twice their median absolute deviation over their median, and the median own spread (one cold or
    stalled measurement among three moves these little, as it moves their median little)."""
    if len(samples) < 2 or min(samples) <= 0:
        return max(own, default=0.0)
    if len(samples) == 2:
        return max(max(samples) / min(samples) - 1, *own)
    mid = statistics.median(samples)
    return max(2 * statistics.median(abs(x - mid) for x in samples) / mid, statistics.median(own) if own else 0.0)


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


def measured_classes(req) -> set[tuple]:
    """(model id, kernel class) of every setting the request has a measurement of."""
    return {(m.model_id, kernel_class(m.setup)) for m in req.measured_steps}


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
                  measured: dict | None = None, ratios: dict | None = None,
                  predict_twin: Callable[[TrainingSetup], float] | None = None) -> tuple[float, str]:
    """(seconds, how) of one setting: how is "measured", "class" (scaled by its class's measured
    ratio), "predicted" (the prediction with the skew hook, see unmeasured_factor) or "twin" (its
    checkpoint-free twin's time, where that is slower: twin_floor; `predict_twin` gives the speed
    model's step seconds of the twin, called only when its class is measured). `measured` and
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
        seconds, how = planner_seconds * ratio, "class"
    else:
        seconds, how = planner_seconds * unmeasured_factor(ratios, settle=req.measured_settle), "predicted"
    floor = twin_floor(req, s, measured, ratios, predict_twin)
    if floor is not None and floor > seconds:
        return floor, "twin"
    return seconds, how


def twin_floor(req, s: TrainingSetup, measured: dict, ratios: dict,
               predict_twin: Callable[[TrainingSetup], float] | None) -> float | None:
    """The step time a checkpointed setting is at least (checkpoint_free_twin): its twin's measured
    time, else the twin's prediction scaled by the twin's measured class. (A speed model wrong about
    one attention kernel predicted every checkpointed setting of it 20x too fast: measured once
    without checkpointing, the kernel's ratio bounds the checkpointed ones, which then need no
    measurement of their own.) None: no twin, or nothing known of it."""
    twin = checkpoint_free_twin(s)
    if twin is None:
        return None
    if twin in measured:
        return measured[twin].step_seconds
    ratio = ratios.get(kernel_class(twin))
    if ratio is None or predict_twin is None:
        return None
    return predict_twin(twin) * skew_factor(req.speed_skew, twin) * ratio


def twin_known(s: TrainingSetup, measured: dict, ratios: dict) -> bool:
    """Whether twin_floor can bound `s`: checkpointed, its twin measured or of a measured class."""
    twin = checkpoint_free_twin(s)
    return twin is not None and (twin in measured or kernel_class(twin) in ratios)


def checkpoint_free_twin(s: TrainingSetup) -> TrainingSetup | None:
    """The same setting without gradient checkpointing, or None when `s` has none. Checkpointing
    only adds work (the forward again in the backward; bench/results/plan_quality.md measured 0.75x
    the speed of the same setting without it), so a checkpointed setting is at least as slow as its
    twin: the probe measures it after the settings that are not so bounded, never once the twin is
    measured, and then ranks it at least as slow as the twin."""
    if s.grad_checkpointing == "none":
        return None
    return dataclasses.replace(s, grad_checkpointing="none")


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
        from trainfit.core.run.prediction import scaled_speed

        speed = base(m, s)
        if m.id == model.id:
            known, classes = measured, ratios
        else:
            known, classes = _measured(req.measured_steps, m.id), class_ratios(req.measured_steps, m.id)
        seconds, _ = adjusted_step(req, m.id, s, speed.step_seconds, measured=known, ratios=classes,
                                   predict_twin=lambda twin: base(m, twin).step_seconds)
        return scaled_speed(speed, seconds / speed.step_seconds) if speed.step_seconds > 0 else speed
    return fn


def predict_run(req, model: ModelSpec, s: TrainingSetup, workload):
    """core.run.prediction.predict_run for the plan's pick, at its measured (or class-scaled) step
    time when the probe measured it: the figures then say what this machine does."""
    from trainfit.core.run.power import estimate_power
    from trainfit.core.run.prediction import RunPrediction, predict_run as predict, scaled_speed
    from trainfit.core.speed import predict_step

    measured = _measured(req.measured_steps, model.id)
    ratios = class_ratios(req.measured_steps, model.id)
    # Which figure applies is known before predicting: one prediction either way.
    unadjusted = (s not in measured and kernel_class(s) not in ratios and not req.speed_skew
                  and not twin_known(s, measured, ratios))
    if not active(req) or unadjusted:
        return predict(model, s, req.hardware, workload, price_per_kwh=req.price_per_kwh,
                       step_time_factor=req.step_time_factor, calibration_source=req.calibration_source)
    base = predict(model, s, req.hardware, workload, price_per_kwh=req.price_per_kwh)
    raw = base.speed.step_seconds  # the speed model's step (no calibration factor applied to base)
    seconds, how = adjusted_step(req, model.id, s, raw, measured=measured, ratios=ratios,
                                 predict_twin=lambda twin: predict_step(model, twin, req.hardware).step_seconds)
    factor = seconds / raw if raw > 0 else 1.0
    speed = scaled_speed(base.speed, factor)
    note = {"measured": f"step time measured on this machine by the plan's probe ({seconds:.3g} s, "
                        f"x{factor:.2f} the speed model)",
            "class": f"step time x{factor:.2f}: the speed model scaled by the probe's measured ratio for this "
                     "precision / attention / checkpointing",
            "predicted": f"step time x{factor:.2f} (speed-model skew test hook)",
            "twin": f"step time x{factor:.2f}: at least that of the same setting without gradient checkpointing, "
                    "measured on this machine by the plan's probe (or scaled by its measured ratio)"}[how]
    return RunPrediction(speed, estimate_power(req.hardware, speed, price_per_kwh=req.price_per_kwh), factor,
                         [*base.notes, note])


@dataclass(frozen=True)
class ProbeCandidate:
    model: ModelSpec
    setup: TrainingSetup
    predicted_step_seconds: float  # the planner's figure (skew hook included, no measurement)
    modes: tuple[str, ...]  # the modes whose band it is in
    ranked_step_seconds: float | None = None  # the search's figure (measurements applied: adjusted_step)


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
        leader = min(timed, key=lambda c: c.speed.step_seconds)
        measured = _measured(req.measured_steps, model.id)
        # A measured leader may itself be off by its noise: the band widens by its spread.
        noise = measured[leader.setup].spread if leader.setup in measured else 0.0
        limit = leader.speed.step_seconds * BAND * (1 + noise)
        in_band = [c for c in timed if c.speed.step_seconds <= limit]
        fits = {c.setup for c in fitting}
        for c, neighbour in [*((c, False) for c in in_band), *((c, True) for c in split_neighbours(leader, timed))]:
            if c.setup in measured or c.setup.method == "inference" or c.setup.num_gpus > 1:
                continue  # measured already; one process, one device: what a probe can run
            if checkpoint_free_twin(c.setup) in measured:
                continue  # at least as slow as its twin, measured already (checkpoint_free_twin)
            key = (model.id, c.setup)
            entry = found.setdefault(key, {"model": model, "setup": c.setup, "at": c.speed.step_seconds, "modes": [],
                                           "neighbour": False, "dominated_in": {}})
            entry["neighbour"] |= neighbour
            entry["dominated_in"][mode] = checkpoint_free_twin(c.setup) in fits
            if mode not in entry["modes"]:
                entry["modes"].append(mode)
    ordered = sorted(found.values(), key=lambda e: e["at"])
    # The balanced mode's candidates first (the plan's middle configuration, whose pick the probe's
    # calibration sample is), then the other modes'.
    primary = PRIMARY_MODE if PRIMARY_MODE in results else None
    classes = measured_classes(req)
    queue: list[dict] = []
    for group in ([e for e in ordered if primary in e["modes"]], [e for e in ordered if primary not in e["modes"]]):
        queue += _measuring_order(group, classes, primary)
    out = []
    for e in queue[:ROUND_SIZE]:
        planner_seconds = predict_step(e["model"], e["setup"], req.hardware).step_seconds \
            * skew_factor(req.speed_skew, e["setup"])
        out.append(ProbeCandidate(e["model"], e["setup"], planner_seconds, tuple(e["modes"]), e["at"]))
    return out


def _measuring_order(entries: list[dict], classes: set, mode: str | None) -> list[dict]:
    """The best of each kernel class not measured yet first (where the model's errors are
    systematic), then the leaders' split neighbours, then the rest; last, the checkpointed settings
    whose twin without checkpointing fits (in `mode`, or in every mode they are candidates of): they
    can only win where that twin, measured first, wins. `classes` gains the classes placed."""
    firsts, neighbours, rest, dominated = [], [], [], []
    for e in entries:
        k = (e["model"].id, kernel_class(e["setup"]))
        by_mode = e["dominated_in"]
        if by_mode[mode] if mode in by_mode else all(by_mode.values()):
            dominated.append(e)
            continue
        (firsts if k not in classes else neighbours if e["neighbour"] else rest).append(e)
        classes.add(k)
    return firsts + neighbours + rest + dominated


def split_neighbours(leader, fitting: list) -> list:
    """The fitting candidates that differ from `leader` only in how its global batch is split: the
    micro-batch halved (accumulation doubled) or doubled (accumulation halved)."""
    s = leader.setup
    splits = []
    if s.micro_batch % 2 == 0:
        splits.append(dataclasses.replace(s, micro_batch=s.micro_batch // 2, grad_accum=s.grad_accum * 2))
    if s.grad_accum % 2 == 0:
        splits.append(dataclasses.replace(s, micro_batch=s.micro_batch * 2, grad_accum=s.grad_accum // 2))
    return [c for c in fitting if c.setup in splits]


def with_measurements(req, steps) -> object:
    """The request with more measured steps (a setting measured again is pooled with its earlier
    measurements of this probe, `pooled`)."""
    keep: dict[tuple, MeasuredStep] = {}
    for m in (*req.measured_steps, *steps):
        k = (m.model_id, m.setup)
        keep[k] = pooled(keep[k], m) if k in keep else m
    return dataclasses.replace(req, measured_steps=tuple(keep.values()))


# The searches behind a plan's picks, recorded while `planner.plan_searched` plans (mode_plan.plan_model
# notes each mode's search), so the probe does not search every mode a second time.
_SEARCHES: ContextVar[dict | None] = ContextVar("trainfit_plan_searches", default=None)


def note_search(mode: str, model: ModelSpec, result) -> None:
    found = _SEARCHES.get()
    if found is not None:
        found[(mode, model.id)] = (model, result.fitting)


@contextmanager
def recording_searches():
    """Inside the block each mode's search is noted in the dict it yields."""
    found: dict = {}
    token = _SEARCHES.set(found)
    try:
        yield found
    finally:
        _SEARCHES.reset(token)


def pinned(req, mode: str, model: ModelSpec, result):
    """The search result with the probe's kept pick for this mode ranked first (`measured_pins`)."""
    for pin_mode, model_id, setup in req.measured_pins:
        if pin_mode != mode or model_id != model.id:
            continue
        pick = next((c for c in result.fitting if c.setup == setup), None)
        if pick is not None and pick is not result.best:
            return dataclasses.replace(result, best=pick, fitting=[pick, *(c for c in result.fitting if c is not pick)])
    return result


def setup_label(s: TrainingSetup) -> str:
    ck = "ckpt" if s.grad_checkpointing != "none" else "no-ckpt"
    return f"{s.method} {s.precision} {s.attention} {ck} {s.optimizer} mb{s.micro_batch}x{s.grad_accum} seq{s.seq_len}"


@dataclass(frozen=True)
class Decision:
    """Why a mode's pick is what it is after the probe, with the measured evidence."""

    mode: str
    action: str  # "confirmed", "kept", "switched", "unmeasured"
    speed_model_pick: TrainingSetup
    pick: TrainingSetup
    challenger: TrainingSetup | None  # the setting compared with the speed model's pick
    faster_by: float | None  # challenger's speed over the speed model's pick's, minus 1 (0.03: 3 % faster)
    spread: float | None  # the noise the gap was held against (>= MIN_SPREAD)
    repeats: dict  # setting label -> measurements of it
    text: str

    @property
    def pin(self) -> bool:
        return self.action == "kept"


def decide(mode: str, model_pick: TrainingSetup, model_pick_seconds: float, ranked_pick: TrainingSetup,
           ranked_seconds: float, measured: dict, runner_up: MeasuredStep | None = None,
           pick_error: str | None = None) -> Decision:
    """Keep the speed model's pick unless a setting is measured faster by more than the noise.

    `ranked_pick`: the measured ranking's pick; `*_seconds`: the two settings' figures in that
    ranking (measured, "at least" x BAND, or scaled by their class's measured ratio); `measured`:
    setup -> MeasuredStep of this model; `runner_up`: the fastest setting measured to the end other
    than the speed model's pick (the evidence for a confirmation); `pick_error`: why the speed
    model's pick could not run here, if it could not.

    The noise: where both were measured again (interleaved, their figures pooled_seconds), MIN_SPREAD,
    the margin of a tie; the measurements are then what this machine does, and the speed model, whose
    error on this pair they just showed, has no say beyond a tie. The same where the measurements show
    the speed model misjudged this pair beyond its error and their spread (model_misjudged): its word
    is what keeping its pick would rest on. Where either was measured once, the larger of the two
    measurements' spreads, at least MIN_SPREAD (a cold or disturbed single reading); where either was
    not measured to the end, also the speed model's error. Where neither was measured to the end, the
    speed model's pick stays: two estimates say nothing a measurement said."""
    def complete(m: MeasuredStep | None) -> MeasuredStep | None:
        return m if m is not None and not m.lower_bound else None

    name = setup_label
    inc = complete(measured.get(model_pick))
    if ranked_pick == model_pick:
        if inc is None:
            return Decision(mode, "unmeasured", model_pick, model_pick, None, None, None, {},
                            "the speed model's pick, not measured to the end (nothing measured beat it)")
        reps = {name(model_pick): inc.repeats}
        if complete(runner_up) is None:
            return Decision(mode, "confirmed", model_pick, model_pick, None, None, None, reps,
                            f"confirmed: the speed model's pick measured {inc.step_seconds:.3g} s/step "
                            f"(spread {inc.spread:.0%}), nothing measured faster")
        slower = runner_up.step_seconds / inc.step_seconds - 1
        reps[name(runner_up.setup)] = runner_up.repeats
        return Decision(mode, "confirmed", model_pick, model_pick, runner_up.setup, -slower,
                        max(MIN_SPREAD, inc.spread, runner_up.spread), reps,
                        f"confirmed: the speed model's pick measured fastest; the next, {name(runner_up.setup)}, "
                        f"{slower:.0%} slower")
    ch = complete(measured.get(ranked_pick))
    reps = {name(s): m.repeats for s, m in ((model_pick, inc), (ranked_pick, ch)) if m is not None}
    if pick_error:
        return Decision(mode, "switched", model_pick, ranked_pick, ranked_pick, None, None, reps,
                        f"switched: the speed model's pick could not run here ({pick_error}); the measured "
                        f"ranking picks {name(ranked_pick)}")
    if inc is None and ch is None:
        return Decision(mode, "kept", model_pick, model_pick, ranked_pick, None, None, reps,
                        f"kept the speed model's pick: neither it nor {name(ranked_pick)} was measured to the end")
    gain = model_pick_seconds / ranked_seconds - 1 if ranked_seconds > 0 else 0.0
    spreads = [m.spread for m in (inc, ch) if m is not None]
    held_to = "spread"
    if inc is not None and ch is not None:
        rechecked = min(inc.repeats, ch.repeats) >= 2
        misjudged = model_misjudged(inc, ch)
        noise = MIN_SPREAD if rechecked or misjudged else max(MIN_SPREAD, *spreads)
        held_to = "margin of a tie" if rechecked or misjudged else held_to
        how, what = _repeats_text(inc, ch), "measured"
        if misjudged and not rechecked:
            how += (f"; the speed model misjudged this pair {misjudged:.2g}x, beyond its "
                    f"{SPEED_MODEL_ERROR:.0%} error and the measurements' spread")
    else:
        noise = max(MIN_SPREAD, SPEED_MODEL_ERROR, *spreads)
        unmeasured = "the speed model's pick" if inc is None else name(ranked_pick)
        how = (f"{unmeasured} not measured to the end: its kernel class's measured ratio, or its lower bound, "
               "within the speed model's error")
        what = "ranked"
    if gain > noise:
        return Decision(mode, "switched", model_pick, ranked_pick, ranked_pick, gain, noise, reps,
                        f"switched: {name(ranked_pick)} {what} {gain:.0%} faster than the speed model's pick "
                        f"{name(model_pick)}, beyond the {noise:.0%} {held_to} ({how})")
    return Decision(mode, "kept", model_pick, model_pick, ranked_pick, gain, noise, reps,
                    f"kept the speed model's pick: {name(ranked_pick)} {what} {gain:.0%} faster, within the "
                    f"{noise:.0%} {held_to} ({how})")


def model_misjudged(pick: MeasuredStep, challenger: MeasuredStep) -> float | None:
    """How far the speed model misjudged a pair its pick lost (the measured pick-over-challenger step
    time over the predicted one), where that is beyond the speed model's error band widened by the
    two measurements' spread; else None. (A speed model wrong about one attention kernel predicted
    its pick 26x faster than a setting measured 21 % faster than it: its word on that pair is no
    reason to keep its pick.)"""
    if min(pick.step_seconds, challenger.step_seconds, pick.predicted_step_seconds,
           challenger.predicted_step_seconds) <= 0:
        return None
    off = (pick.step_seconds / challenger.step_seconds) / (pick.predicted_step_seconds
                                                            / challenger.predicted_step_seconds)
    return off if off > BAND * (1 + max(pick.spread, challenger.spread)) else None


def _repeats_text(a: MeasuredStep, b: MeasuredStep) -> str:
    n = min(a.repeats, b.repeats)
    if n == 1:
        return "one measurement each"
    return (f"{n} interleaved measurements each, {'the faster' if n == 2 else 'the median'} of each compared; "
            f"their spreads {a.spread:.0%} and {b.spread:.0%}")
