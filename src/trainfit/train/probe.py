"""The plan's probe: a few seconds of real training steps that confirm the planner's pick on the
machine it plans for.

The speed model ranks settings; where two of them lie within its error of each other
(core.plan.measured.BAND), only a measurement can tell which is faster here. `confirm_plan`
plans, asks core.plan.measured.shortlist which settings could still beat the pick, measures them
(`ProbeSession`, a child process, so a setting that runs far slower than predicted is stopped at
its time share: a micro-batch that did not finish by then says the step takes at least that long), plans again with the measured step times, and repeats until the pick is
measured and nothing unmeasured is within the band, or the time (`--probe-seconds`) is spent.

What it measures, per setting: the model built from its config with random weights (the real
shape, or a slice of its layers when a step of the whole model would not fit the time share or
its random init would take too long; the slice's measured / predicted ratio is applied to the
whole model's prediction), fed random token ids of the setting's micro-batch x sequence length,
with the setting's precision (autocast for *-mixed), attention kernel, gradient checkpointing,
LoRA adapters, DPO reference and optimizer: warm-up micro-batches and optimizer steps until the
setting runs settled (settled_after), then timed micro-batches (forward + backward) and optimizer
steps. Step time = accumulation x median micro-batch + median optimizer step; its spread
(micro_spread) says how noisy the figure is, and the finalists are measured again, interleaved,
before the pick moves off the speed model's (confirm_plan, core.plan.measured.decide). (No
one-sequence pilot to extrapolate from: on a busy CPU a small model's micro-batch is mostly per-op
overhead, one sequence took 0.5-0.9 s where sixteen took 0.75 s, and scaling it by the rows
misjudged every setting.) Only settings the memory model says fit are ever launched (the
shortlist comes from the search's fitting candidates).

The measurements are stored with this machine's calibration (train/calibration.py: the step-time
ratio of the balanced pick as a calibration sample, the step times as `probe_steps`), so the next
plan of the same model and settings finds them and needs no probe. A measurement taken on a busy
machine (calibration.check_load) ranks this plan's settings but is not reused later.

The measuring child is trainfit.train.probe_child (`python -m trainfit.train.probe_child --child`,
JSON lines on stdin and stdout); the stored measurements are trainfit.train.probe_store. Nothing
here imports torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan.measured import (BAND, MIN_SPREAD, PRIMARY_MODE, RECHECK_GAP, kernel_class,
                                         measured_classes, setup_label)
from trainfit.core.setup import TrainingSetup
from trainfit.train.probe_session import ProbeJob, ProbeSession
from trainfit.train.probe_store import load_probe_steps, store_measurements

DEFAULT_PROBE_SECONDS = 30.0
# A random init of a larger model on a CPU takes longer than a probe has (~1 s per 100M parameters
# here): beyond this the probe builds a slice of the layers.
MAX_BUILD_PARAMS = 300_000_000
# A slice of the layers is built when fewer than this many predicted micro-batches of the whole
# model fit the setting's time share (a warm-up and two timed ones at least; the speed model errs by
# a few x on small shapes, so slicing on its word alone would slice models that need none).
SLICE_PIECES = 3
MIN_SHARE_SECONDS = 3.0  # below this a setting is not started
# The finalists (the speed model's pick and a setting measured faster) are measured again,
# interleaved with their first measurement (A B B A), at most this many times per probe.
MAX_RECHECKS = 3
MAX_PAIR_RECHECKS = 2  # a pair still within the noise after one re-measurement gets a second

Log = Callable[[str], None]


def missing_extra() -> str | None:
    """Why the probe cannot run here (the `train` extra), or None."""
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return f"the train extra is not installed ({module} missing: pip install 'trainfit[train]')"
    return None


def slice_for(spec: ModelSpec, setup: TrainingSetup, hardware, share_seconds: float) -> tuple[ModelSpec, float]:
    """(model to build, whole / slice predicted step time): the whole model when a micro-batch of it
    fits the time share and its init is quick, else the largest slice of its layers that does."""
    from trainfit.core.speed import predict_step

    full = predict_step(spec, setup, hardware)
    micro = max(full.micro_step_seconds, 1e-9)
    params = spec_params(spec)
    keep = min(1.0, share_seconds / SLICE_PIECES / micro, MAX_BUILD_PARAMS / max(params, 1))
    layers = max(1, min(spec.num_layers, int(spec.num_layers * keep)))
    if layers >= spec.num_layers:
        return spec, 1.0
    part = dataclasses.replace(spec, num_layers=layers, id=f"{spec.id} ({layers} of {spec.num_layers} layers)")
    part_step = predict_step(part, setup, hardware).step_seconds
    return part, full.step_seconds / part_step if part_step > 0 else 1.0


def spec_params(spec: ModelSpec) -> int:
    from trainfit.core.models.params import total_params

    try:
        return int(total_params(spec))
    except Exception:  # an unusual spec: size it by its layers (never blocks the probe)
        return spec.num_layers * 12 * spec.hidden_size ** 2


# ---------------------------------------------------------------------------------------------
# the loop: plan, shortlist, measure, plan again
@dataclass(frozen=True)
class ProbeReport:
    ran: bool
    skipped: str | None  # why no probe ran
    seconds: float  # wall time spent probing (child start included)
    budget_seconds: float
    rounds: int
    confirmed: bool  # every pick measured, nothing unmeasured within the speed model's error of it
    unconfirmed: str | None  # why not, when not
    band: float  # core.plan.measured.BAND
    measurements: list[dict]
    picks: list[dict]  # per mode: the speed model's pick, the final pick and the decision's evidence
    stored: str | None  # where the measurements were stored, or why not
    load_average_1m: list[float | None]  # at start and end
    rechecks: int = 0  # finalist pairs measured again, interleaved


@dataclass
class _Measuring:
    """One probe's measuring state: what it measured, what could not run, how long each took."""

    session: Any
    log: Log
    deadline: float  # monotonic
    new: list = field(default_factory=list)  # this probe's MeasuredSteps, in the order measured
    failed: dict = field(default_factory=dict)  # (model id, setup) -> why it could not be measured
    walls: dict = field(default_factory=dict)  # (model id, setup) -> seconds its last measurement took
    rounds: int = 0
    rechecks: int = 0  # finalist pairs measured again
    rechecked: dict = field(default_factory=dict)  # (model id, setup, setup) -> times measured again
    jobs: int = 0

    def measure(self, req, model: ModelSpec, setup: TrainingSetup, predicted: float, share: float,
                deadline: float, what: str = "measuring"):
        """Measure one setting for `share` seconds (never past `deadline`): its MeasuredStep, or None."""
        from trainfit.core.plan.measured import MeasuredStep

        key = (model.id, setup)
        if not self.session.ready(deadline):
            self.failed[key] = "the probe process did not start in time (importing torch)"
            self.log(f"probe: {setup_label(setup)} not measured: {self.failed[key]}")
            return None
        build, scale = slice_for(model, setup, req.hardware, share)
        job = ProbeJob(self.jobs, build, setup, share, _torch_device(setup))
        self.jobs += 1
        self.log(f"probe: {what} {setup_label(setup)}"
                 + (f" on {build.num_layers} of {model.num_layers} layers" if build is not model else "")
                 + f" (predicted {predicted:.3g} s/step, up to {share:.0f} s, "
                   f"{max(0.0, self.deadline - time.monotonic()):.0f} s of the probe left)")
        res = self.session.measure(job, deadline)
        self.walls[key] = res.wall_seconds
        if res.step_seconds is None:
            if not (res.error or "").startswith("stopped before"):  # that one may get more time next round
                self.failed[key] = res.error or "no measurement"
            self.log(f"probe:   not measured: {res.error}")
            return None
        step = res.step_seconds * scale
        m = MeasuredStep(model.id, setup, step, predicted, res.lower_bound, spread=res.spread, samples=(step,),
                         sample_spreads=(res.spread,))
        self.new.append(m)
        self.log(f"probe:   {'>= ' if res.lower_bound else ''}{step:.3g} s/step measured "
                 f"({step / predicted:.2f}x predicted; {res.how}; {res.wall_seconds:.1f} s)")
        return m


def confirm_plan(req, *, seconds: float = DEFAULT_PROBE_SECONDS, log: Log = lambda m: None,
                 calibration_file: Path | None = None, store: bool = True, session: Any = None):
    """Plan `req`, confirming the picks with measured steps on this machine. Returns (plan, report).
    `session`: what measures (default a ProbeSession; tests pass one with known step times).

    Rounds: plan, measure the best unmeasured setting of the shortlist, plan again. Then the
    finalists (a mode's measured pick where it is not the speed model's) are measured again,
    interleaved, and `core.plan.measured.decide` judges them (measured again, the faster by more than
    a tie wins; measured once, only by more than the two measurements' spread)."""
    from trainfit.core.plan import measured as mm
    from trainfit.core.plan.planner import plan, plan_searched
    from trainfit.train import calibration as cal

    t0 = time.monotonic()
    load_start = _load()
    unavailable = missing_extra() if session is None else None
    session = session or ProbeSession(log, warm_spec=req.model)
    if unavailable is None:
        session.launch()
    model_only, searches = plan_searched(req)  # what the speed model alone picks
    fingerprint = cal.machine_fingerprint(req.hardware)
    key = _device_key(req.hardware)
    stored = load_probe_steps(fingerprint, key, calibration_file)
    result = model_only
    if stored:
        req = mm.with_measurements(req, stored)
        result, searches = plan_searched(req)
    run = _Measuring(session, log, t0 + seconds)
    reason, confirmed = unavailable, False
    try:
        while True:
            req, result, searches, confirmed, reason = _explore(run, req, result, searches, model_only, reason,
                                                                 seconds)
            if unavailable is not None:
                break
            rechecks = run.rechecks
            req, result, searches = _recheck_finalists(run, req, result, searches, model_only)
            if run.rechecks == rechecks:
                break
            reason = None  # a setting measured again moves the ranking and its spread: the shortlist again
    finally:
        session.close()
    decisions: list = []
    if req.measured_steps:  # the final ranking: unmeasured classes at this machine's typical error
        req = dataclasses.replace(req, measured_settle=True)
        result, searches = plan_searched(req)
        decisions = _decisions(req, result, searches, model_only, run.failed)
        pins = tuple((mp.mode, mp.model_id, d.pick) for mp, d in decisions if d.pin)
        if pins:  # kept: the speed model's pick ranks first where nothing beat it beyond the noise
            req = dataclasses.replace(req, measured_pins=pins)
            result = plan(req)
    spent = time.monotonic() - t0
    load_end = _load()
    where = None
    if run.new:
        where = (store_measurements(req, result, fingerprint, key, calibration_file, [d for _, d in decisions]) if store
                 else "not stored (store=False)")
    if run.new:
        skipped = None
    elif confirmed and stored:
        skipped = "the measurements stored by an earlier plan on this machine already confirm the picks"
    elif confirmed:
        skipped = "nothing to measure: no setting that fits runs in one process on one device"
    else:
        skipped = reason
    confirmed = confirmed and bool(req.measured_steps)  # confirmed by a measurement, not by having none
    report = ProbeReport(
        ran=bool(run.new), skipped=skipped, seconds=spent, budget_seconds=seconds, rounds=run.rounds,
        confirmed=confirmed, unconfirmed=None if confirmed else reason, band=mm.BAND,
        measurements=[_measurement_json(m) for m in req.measured_steps]
        + [{"model": mid, "setup": setup_label(s), "error": why} for (mid, s), why in run.failed.items()],
        picks=_picks(model_only, result, dict((mp.mode, d) for mp, d in decisions)), stored=where,
        load_average_1m=[load_start, load_end], rechecks=run.rechecks)
    return result, report


def _explore(run: _Measuring, req, result, searches, model_only, reason: str | None, seconds: float):
    """Rounds until the shortlist is empty (confirmed) or the time is up (reason): measure its best
    setting, plan again. Returns (req, result, searches, confirmed, reason)."""
    from trainfit.core.plan.planner import plan_searched
    from trainfit.core.plan import measured as mm

    while True:
        todo = [c for c in mm.shortlist(req, searches) if (c.model.id, c.setup) not in run.failed]
        if not todo:
            return req, result, searches, True, reason
        reserve = _time_to_keep(req, result, model_only, run, todo[0], searches)
        if reason is not None or time.monotonic() + MIN_SHARE_SECONDS + reserve > run.deadline:
            reason = reason or (f"time is up ({seconds:g} s) with {len(todo)} setting(s) still unmeasured"
                                + (f" ({reserve:.0f} s kept to measure the finalists again)" if reserve else ""))
            return req, result, searches, False, reason
        run.rounds += 1
        failures = len(run.failed)
        got = _measure_round(run, req, todo, reserve)
        if not got:
            if len(run.failed) == failures or time.monotonic() + MIN_SHARE_SECONDS > run.deadline:
                reason = (f"time is up ({seconds:g} s) with {len(todo)} setting(s) still unmeasured" if run.new
                          else f"no setting could be measured in the {seconds:g} s")
                return req, result, searches, False, reason
            continue  # the ones that cannot run here are left out of the next shortlist
        req = mm.with_measurements(req, got)
        result, searches = plan_searched(req)


def _measure_round(run: _Measuring, req, todo: list, reserve: float) -> list:
    """One setting a round (its measurement re-ranks the rest: a slow kernel class drops out at
    once), with the time `reserve` kept for measuring the finalists again."""
    cand = todo[0]
    deadline = run.deadline - reserve
    left = deadline - time.monotonic()
    if left < MIN_SHARE_SECONDS:
        return []
    share = max(left / max(len(todo), 2), MIN_SHARE_SECONDS)  # too little for all: the best ones first
    m = run.measure(req, cand.model, cand.setup, cand.predicted_step_seconds, share, deadline)
    return [m] if m is not None else []


def _decidable(mp, before) -> bool:
    """A mode where `core.plan.measured.decide` judges the measured pick against the speed model's:
    one ranked by step time (extreme, which picks the largest micro-batch near the fastest, only
    where both picks have the same micro-batch: then they differ in speed alone)."""
    if not mp.fits or mp.setup is None or before is None or before.setup is None or mp.setup.method == "inference":
        return False
    if before.model_id != mp.model_id:
        return False
    return not mp.targets.largest_micro_batch or mp.setup.micro_batch == before.setup.micro_batch


def _finalists(req, result, model_only, rechecked: dict, searches: dict) -> list[tuple]:
    """(model id, speed model's pick, challenger, gap) where the measured ranking replaced the
    speed model's pick with another setting (the challenger), both measured to the end, less than
    RECHECK_GAP apart; or, where the speed model's pick was measured fastest, the runner-up of its
    mode (`searches`: its ranked candidates) measured within the noise of it: a confirmation resting
    on one reading each is as fragile as a switch (one probe confirmed sdpa 1 % ahead of eager
    attention, which the benchmark's sweep measured 9 % faster). A pair measured again already only
    while its gap is still within the noise (then once more)."""
    before = {mp.mode: mp for mp in model_only.modes if mp.fits}
    out = []
    # the balanced mode's pair first, as its candidates are measured first (shortlist)
    for mp in sorted(result.modes, key=lambda mp: mp.mode != PRIMARY_MODE):
        b = before.get(mp.mode)
        if not _decidable(mp, b):
            continue
        measured = {m.setup: m for m in req.measured_steps if m.model_id == mp.model_id and not m.lower_bound}
        inc, ch = measured.get(b.setup), measured.get(mp.setup)
        if b.setup == mp.setup:
            ch = _runner_up(measured, searches, mp.mode, b.setup)
        if inc is None or ch is None or ch.step_seconds <= 0:
            continue
        if inc.source == ch.source == "stored":
            continue  # judged by the earlier plan's probe that measured them
        pair = (mp.model_id, b.setup, ch.setup)
        gap = inc.step_seconds / ch.step_seconds - 1
        noise = max(MIN_SPREAD, inc.spread, ch.spread)
        times = rechecked.get(pair, 0)
        within = abs(gap) <= noise if b.setup == mp.setup else gap <= noise  # a confirmation: either way
        if b.setup == mp.setup and not within:
            continue
        if gap < RECHECK_GAP and (times == 0 or times < MAX_PAIR_RECHECKS and within) and pair not in out:
            out.append((*pair, gap))
    return out


def _time_to_keep(req, result, model_only, run: _Measuring, next_up, searches: dict) -> float:
    """Seconds the exploring keeps back for measuring the finalists again: none while the next
    setting is of a kernel class not measured yet and could beat a pick of its modes (its figure
    within the speed model's error band of the pick's: it can be off by that whole error, more than
    a second measurement corrects), else the finalists' (_recheck_reserve). (A class ranked 50 %
    behind the measured pick, measured first, took the seconds that the pick and the speed model's,
    21 % apart in one measurement each, needed to be measured again.)"""
    if (next_up.model.id, kernel_class(next_up.setup)) not in measured_classes(req):
        picks = [mp.speed.step_seconds for mp in result.modes
                 if mp.mode in next_up.modes and mp.fits and mp.speed is not None]
        at = next_up.ranked_step_seconds
        if at is None or not picks or at <= min(picks) * BAND:
            return 0.0
    return _recheck_reserve(req, result, model_only, run, searches)


def _recheck_reserve(req, result, model_only, run: _Measuring, searches: dict) -> float:
    """Seconds to keep for measuring the current finalists again (0 when there are none)."""
    pairs = _finalists(req, result, model_only, run.rechecked, searches) if run.rechecks < MAX_RECHECKS else []
    if not pairs:
        return 0.0
    mid, inc, ch, _ = pairs[0]
    return sum(max(MIN_SHARE_SECONDS, run.walls.get((mid, s), MIN_SHARE_SECONDS)) for s in (inc, ch))


def _recheck_finalists(run: _Measuring, req, result, searches, model_only):
    """Measure each finalist pair again, the one measured last first (A B, then B A, then A B: a
    drift in the machine's speed, or a cold first measurement, weighs on both alike);
    `with_measurements` pools the repeats (median, spread)."""
    from trainfit.core.plan.planner import plan_searched
    from trainfit.core.plan import measured as mm

    models = {mp.model_id: mp.model for mp in result.modes if mp.fits and mp.model is not None}
    while run.rechecks < MAX_RECHECKS:
        pairs = _finalists(req, result, model_only, run.rechecked, searches)
        if not pairs:
            break
        mid, inc, ch, gap = pairs[0]
        run.rechecked[(mid, inc, ch)] = run.rechecked.get((mid, inc, ch), 0) + 1
        last = {(m.model_id, m.setup): i for i, m in enumerate(run.new)}
        order = (inc, ch) if last.get((mid, inc), -1) > last.get((mid, ch), -1) else (ch, inc)
        shares = [max(MIN_SHARE_SECONDS, run.walls.get((mid, s), MIN_SHARE_SECONDS)) for s in order]
        left = run.deadline - time.monotonic()
        if left < 2 * MIN_SHARE_SECONDS:
            run.log(f"probe: no time left to measure {setup_label(ch)} ({abs(gap):.0%} "
                    f"{'faster' if gap > 0 else 'slower'}) and the speed model's pick again")
            break
        if sum(shares) > left:  # what is left, shared: a shorter measurement still times a few micro-batches
            shares = [max(MIN_SHARE_SECONDS, x * left / sum(shares)) for x in shares]
        predicted = {m.setup: m.predicted_step_seconds for m in req.measured_steps if m.model_id == mid}
        run.rechecks += 1
        got = [m for s, share in zip(order, shares)
               if (m := run.measure(req, models[mid], s, predicted[s], share, run.deadline, what="measuring again"))]
        if not got:
            break
        req = mm.with_measurements(req, got)
        result, searches = plan_searched(req)
    return req, result, searches


def _decisions(req, result, searches, model_only, failed: dict) -> list[tuple]:
    """(mode plan, core.plan.measured.Decision) for each speed-ranked mode the speed model also planned."""
    from trainfit.core.plan import measured as mm

    before = {mp.mode: mp for mp in model_only.modes if mp.fits}
    out = []
    for mp in result.modes:
        b = before.get(mp.mode)
        if not _decidable(mp, b) or mp.speed is None:
            continue
        measured = {m.setup: m for m in req.measured_steps if m.model_id == mp.model_id}
        ranked = {c.setup: c.speed.step_seconds for c in searches.get(mp.mode, (None, []))[1] if c.speed}
        runner_up = _runner_up(measured, searches, mp.mode, b.setup)
        error = failed.get((mp.model_id, b.setup))
        out.append((mp, mm.decide(mp.mode, b.setup, ranked.get(b.setup, b.speed.step_seconds), mp.setup,
                                  ranked.get(mp.setup, mp.speed.step_seconds), measured, runner_up,
                                  pick_error=error)))
    return out


def _runner_up(measured: dict, searches: dict, mode: str, pick: TrainingSetup):
    """The fastest setting measured to the end other than `pick` among `mode`'s ranked candidates
    (`searches`), or None."""
    ranked = {c.setup for c in searches.get(mode, (None, []))[1]}
    others = [m for s, m in measured.items() if s in ranked and s != pick and not m.lower_bound]
    return min(others, key=lambda m: m.step_seconds, default=None)


def _picks(before, after, decisions: dict) -> list[dict]:
    out = []
    for b, a in zip(before.modes, after.modes):
        if not a.fits:
            continue
        entry = {"mode": a.mode, "speed_model_pick": setup_label(b.setup) if b.setup else None,
                 "pick": setup_label(a.setup), "changed": b.setup != a.setup,
                 "step_seconds": a.speed.step_seconds if a.speed else None}
        d = decisions.get(a.mode)
        if d is not None:
            entry["decision"] = {"action": d.action, "text": d.text,
                                 "challenger": setup_label(d.challenger) if d.challenger else None,
                                 "faster_by": d.faster_by, "spread": d.spread, "repeats": d.repeats}
        out.append(entry)
    return out


def _measurement_json(m) -> dict:
    return {"model": m.model_id, "setup": setup_label(m.setup), "measured_step_seconds": m.step_seconds,
            "predicted_step_seconds": m.predicted_step_seconds,
            "measured_over_predicted": m.step_seconds / m.predicted_step_seconds if m.predicted_step_seconds else None,
            "lower_bound": m.lower_bound, "source": m.source, "spread": m.spread, "repeats": m.repeats,
            "samples_seconds": list(m.samples or (m.step_seconds,))}


def _load() -> float | None:
    from trainfit.hardware.cpu_load import load_1m

    load = load_1m()
    return None if load is None else round(load, 2)


def _torch_device(s: TrainingSetup) -> str:
    return {"rocm": "cuda", "xpu": "xpu"}.get(s.device, s.device)


def _device_key(hw) -> str:
    from trainfit.core.plan.hardware_rules import rules_for
    from trainfit.train.calibration import device_key

    device = rules_for(hw).device
    return device_key(device, hw.gpus[0].name if hw.gpus else None)
