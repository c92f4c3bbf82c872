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

Run as `python -m trainfit.train.probe --child` it is the measuring child (JSON lines on stdin
and stdout); everything else here imports no torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainfit.core.model_spec import ModelSpec
from trainfit.core.plan.measured import setup_label
from trainfit.core.setup import TrainingSetup

DEFAULT_PROBE_SECONDS = 30.0
# A random init of a larger model on a CPU takes longer than a probe has (~1 s per 100M parameters
# here): beyond this the probe builds a slice of the layers.
MAX_BUILD_PARAMS = 300_000_000
# A slice of the layers is built when fewer than this many predicted micro-batches of the whole
# model fit the setting's time share (a warm-up and two timed ones at least; the speed model errs by
# a few x on small shapes, so slicing on its word alone would slice models that need none).
SLICE_PIECES = 3
MIN_SHARE_SECONDS = 3.0  # below this a setting is not started
# The child stops a setting itself at the end of its time share; the parent stops the child only
# this share later (a micro-batch still running): a stopped child is started again, paying torch's
# import and a cold first setting again (page faults, thread pools) for the next setting measured.
OVERRUN_SHARE = 0.5
TIMED_MICRO_BATCHES = 4
TIMED_OPTIMIZER_STEPS = 3
# Warm-up, per setting: micro-batches (each with an optimizer step) until one is no longer much faster
# than the one before and its page faults stopped growing the memory. The first setting of a fresh
# process (6 x 256 Llama, micro-batch 16 x 256 tokens, bf16 autocast) faulted in 160-176k then
# 93-119k minor page faults (~0.4-0.7 GB) in its first two micro-batches, 6-17k in the third and
# ~0 after, its first two taking 1.85 and 1.68 CPU-seconds against 1.06 settled (load 2.3): with one
# warm-up micro-batch the second was timed, and the first setting measured read slow against
# those measured after it (0.69 s/step where the benchmark's sweep measured 0.54).
WARMUP_MAX = 4
WARMUP_SHARE = 0.5  # at most this share of a setting's time goes to its warm-up
SETTLED_SPEEDUP = 0.9  # a warm-up micro-batch faster than this x the one before: still warming up
SETTLED_FAULT_PAGES = 4096  # 16 MiB of 4 KiB pages: memory no longer growing
UNTIMED_SPREAD = 0.25  # the spread given a step figure from fewer than two timed micro-batches
# The finalists (the speed model's pick and a setting measured faster) are measured again,
# interleaved with their first measurement (A B B A), at most this many times per probe.
MAX_RECHECKS = 3
MAX_PAIR_RECHECKS = 2  # a pair still within the noise after one re-measurement gets a second
STORED_MAX_AGE_SECONDS = 30 * 24 * 3600
MAX_STORED_STEPS = 200

Log = Callable[[str], None]




def missing_extra() -> str | None:
    """Why the probe cannot run here (the `train` extra), or None."""
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return f"the train extra is not installed ({module} missing: pip install 'trainfit[train]')"
    return None


@dataclass(frozen=True)
class ProbeJob:
    """One setting to measure: what the child builds and how long it may take."""

    index: int
    spec: ModelSpec  # the model to build (the whole model, or a slice of its layers)
    setup: TrainingSetup
    share_seconds: float
    device: str  # torch device type: "cpu", "cuda", "mps"


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
    from trainfit.core.params import total_params

    try:
        return int(total_params(spec))
    except Exception:  # an unusual spec: size it by its layers (never blocks the probe)
        return spec.num_layers * 12 * spec.hidden_size ** 2


@dataclass
class SettingResult:
    index: int
    step_seconds: float | None = None
    lower_bound: bool = False
    how: str = ""
    error: str | None = None
    micro_seconds: list[float] = field(default_factory=list)  # timed (after the warm-up)
    optimizer_seconds: list[float] = field(default_factory=list)
    warm_micro: list[float] = field(default_factory=list)
    warm_optimizer: list[float] = field(default_factory=list)
    warm_faults: list[int] = field(default_factory=list)  # minor page faults of each warm-up micro-batch
    wall_seconds: float = 0.0
    spread: float = 0.0  # relative spread of the timed micro-batches (micro_spread)


class ProbeSession:
    """The measuring child process: started once, restarted after a setting had to be stopped."""

    def __init__(self, log: Log, warm_spec: ModelSpec | None = None) -> None:
        self.log = log
        self.warm_spec = warm_spec  # its model code is imported while the child starts
        self.proc: subprocess.Popen | None = None
        self.started = False
        self.lines: queue.Queue = queue.Queue()

    def launch(self) -> None:
        """Start the child now (its torch import overlaps the planning); `ready` waits for it."""
        if self.proc is None:
            self._spawn()

    def ready(self, deadline: float) -> bool:
        """The child is up and has imported torch (started again when it was stopped)."""
        if self.proc is None:
            self._spawn()
        if self.started:
            return True
        while True:
            event = self._next(deadline)
            if event is None:
                self.close()
                return False
            if event.get("event") == "ready":
                self.started = True
                return True

    def _spawn(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
        src = str(Path(__file__).resolve().parents[2])  # the trainfit this process runs, for the child too
        env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
        from trainfit.core.serde import to_jsonable

        warm = [json.dumps(to_jsonable(self.warm_spec))] if self.warm_spec is not None else []
        self.proc = subprocess.Popen([sys.executable, "-m", "trainfit.train.probe", "--child", *warm], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.lines = queue.Queue()
        self.started = False
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                lines.put(json.loads(line))
            except ValueError:
                continue
        lines.put({"event": "exit"})

    def _next(self, deadline: float) -> dict | None:
        try:
            event = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        return None if event.get("event") == "exit" else event

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # our own child, by its handle
            self.proc.wait()
            self.proc = None
            self.started = False

    def measure(self, job: ProbeJob, deadline: float) -> SettingResult:
        """Run one setting for its time share, counted from when its model is built (the build
        pays imports once per architecture), and never past `deadline` (monotonic)."""
        from trainfit.core.serde import to_jsonable

        res = SettingResult(job.index)
        started = time.monotonic()
        if not self.ready(deadline):
            res.error = "the probe process did not start in time (importing torch)"
            return res
        assert self.proc is not None and self.proc.stdin is not None
        body = {"index": job.index, "spec": to_jsonable(job.spec), "setup": to_jsonable(job.setup),
                "share_seconds": job.share_seconds, "device": job.device}
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        built_at = None
        while True:
            event = self._next(deadline if built_at is None else
                               min(deadline, built_at + job.share_seconds * (1 + OVERRUN_SHARE)))
            if event is None:  # stopped at its time share (or the child died): what it finished counts
                stopped = self.proc is not None and self.proc.poll() is None
                code = None if stopped or self.proc is None else self.proc.poll()
                self.close()
                res.wall_seconds = time.monotonic() - started
                if not stopped:  # e.g. killed by the kernel for memory: a finding, not a time-out
                    res.error = f"the probe process ended (exit code {code}) while running this setting"
                return _finish(res, job, built_at, stopped=stopped)
            kind = event.get("event")
            if kind == "built":
                built_at = time.monotonic()
            elif kind in ("micro", "optimizer"):
                timed = res.micro_seconds if kind == "micro" else res.optimizer_seconds
                warm = res.warm_micro if kind == "micro" else res.warm_optimizer
                (warm if event.get("warmup") else timed).append(event["seconds"])
                if kind == "micro" and event.get("warmup") and event.get("faults") is not None:
                    res.warm_faults.append(event["faults"])
            elif kind == "error":
                res.error = event.get("message", "failed")
                res.wall_seconds = time.monotonic() - started
                return res
            elif kind == "done":
                res.wall_seconds = time.monotonic() - started
                return _finish(res, job, built_at, stopped=False)


def _finish(res: SettingResult, job: ProbeJob, built_at: float | None, *, stopped: bool) -> SettingResult:
    """Step time from what finished: accumulation x median micro-batch + median optimizer step
    (the warm-up ones only when no timed one finished: they run slower, so the figure errs high)."""
    accum = job.setup.grad_accum
    micro = res.micro_seconds or res.warm_micro
    optim = res.optimizer_seconds or res.warm_optimizer
    tail = " (stopped at its time share)" if stopped else ""
    if micro:
        res.step_seconds = accum * statistics.median(micro) + (statistics.median(optim) if optim else 0.0)
        res.lower_bound = not optim  # the optimizer step left out
        # fewer than two timed micro-batches show no spread: counted as large, not as none
        res.spread = micro_spread(res.micro_seconds) if len(res.micro_seconds) >= 2 else UNTIMED_SPREAD
        res.how = (f"{len(res.warm_micro)} warm-up + {len(res.micro_seconds)} timed micro-batches, "
                   f"{len(res.optimizer_seconds)} timed optimizer steps, spread {res.spread:.0%}"
                   if res.micro_seconds else "the warm-up micro-batches only") + tail
        return res
    if built_at is not None and stopped:
        # No micro-batch finished within the share: one takes at least as long as it ran.
        res.step_seconds = accum * (time.monotonic() - built_at)
        res.lower_bound = True
        res.how = "no micro-batch finished within its time share: at least this slow"
        return res
    res.error = res.error or "stopped before the model was built (time share too short)"
    return res


def micro_spread(seconds: list[float]) -> float:
    """Relative spread of one setting's timed micro-batches: twice their median absolute deviation
    over their median (the interquartile range of normal noise; unlike the range or the
    interquartile range of four, a single stall, another process taking the core, moves it little)."""
    if len(seconds) < 2:
        return 0.0
    mid = statistics.median(seconds)
    return 2 * statistics.median(abs(x - mid) for x in seconds) / mid if mid > 0 else 0.0


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
    interleaved, and `core.plan.measured.decide` keeps the speed model's pick unless another setting
    was measured faster by more than the two measurements' spread."""
    from trainfit.core.plan import measured as mm
    from trainfit.core.plan.planner import plan
    from trainfit.train import calibration as cal

    t0 = time.monotonic()
    load_start = _load()
    unavailable = missing_extra() if session is None else None
    session = session or ProbeSession(log, warm_spec=req.model)
    if unavailable is None:
        session.launch()
    model_only, searches = mm.plan_searched(req)  # what the speed model alone picks
    fingerprint = cal.machine_fingerprint(req.hardware)
    key = _device_key(req.hardware)
    stored = load_probe_steps(fingerprint, key, calibration_file)
    result = model_only
    if stored:
        req = mm.with_measurements(req, stored)
        result, searches = mm.plan_searched(req)
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
        result, searches = mm.plan_searched(req)
        decisions = _decisions(req, result, searches, model_only, run.failed)
        pins = tuple((mp.mode, mp.model_id, d.pick) for mp, d in decisions if d.pin)
        if pins:  # kept: the speed model's pick ranks first where nothing beat it beyond the noise
            req = dataclasses.replace(req, measured_pins=pins)
            result = plan(req)
    spent = time.monotonic() - t0
    load_end = _load()
    where = None
    if run.new:
        where = (_store(req, result, fingerprint, key, calibration_file, [d for _, d in decisions]) if store
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
    from trainfit.core.plan import measured as mm

    while True:
        todo = [c for c in mm.shortlist(req, searches) if (c.model.id, c.setup) not in run.failed]
        if not todo:
            return req, result, searches, True, reason
        reserve = _recheck_reserve(req, result, model_only, run)
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
        result, searches = mm.plan_searched(req)


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


def _finalists(req, result, model_only, rechecked: dict) -> list[tuple]:
    """(model id, speed model's pick, measured pick, gap) where the measured ranking replaced the
    speed model's pick with another setting, both measured to the end, less than RECHECK_GAP apart;
    a pair measured again already only while its gap is still within the noise (then once more)."""
    from trainfit.core.plan.measured import MIN_SPREAD, RECHECK_GAP

    before = {mp.mode: mp for mp in model_only.modes if mp.fits}
    out = []
    for mp in result.modes:
        b = before.get(mp.mode)
        if not _decidable(mp, b) or b.setup == mp.setup:
            continue
        measured = {m.setup: m for m in req.measured_steps if m.model_id == mp.model_id and not m.lower_bound}
        inc, ch = measured.get(b.setup), measured.get(mp.setup)
        if inc is None or ch is None or ch.step_seconds <= 0:
            continue
        if inc.source == ch.source == "stored":
            continue  # judged by the earlier plan's probe that measured them
        pair = (mp.model_id, b.setup, mp.setup)
        gap = inc.step_seconds / ch.step_seconds - 1
        noise = max(MIN_SPREAD, inc.spread, ch.spread)
        times = rechecked.get(pair, 0)
        if gap < RECHECK_GAP and (times == 0 or times < MAX_PAIR_RECHECKS and gap <= noise) and pair not in out:
            out.append((*pair, gap))
    return out


def _recheck_reserve(req, result, model_only, run: _Measuring) -> float:
    """Seconds to keep for measuring the current finalists again (0 when there are none)."""
    pairs = _finalists(req, result, model_only, run.rechecked) if run.rechecks < MAX_RECHECKS else []
    if not pairs:
        return 0.0
    mid, inc, ch, _ = pairs[0]
    return sum(max(MIN_SHARE_SECONDS, run.walls.get((mid, s), MIN_SHARE_SECONDS)) for s in (inc, ch))


def _recheck_finalists(run: _Measuring, req, result, searches, model_only):
    """Measure each finalist pair again, the one measured last first (A B, then B A, then A B: a
    drift in the machine's speed, or a cold first measurement, weighs on both alike);
    `with_measurements` pools the repeats (median, spread)."""
    from trainfit.core.plan import measured as mm

    models = {mp.model_id: mp.model for mp in result.modes if mp.fits and mp.model is not None}
    while run.rechecks < MAX_RECHECKS:
        pairs = _finalists(req, result, model_only, run.rechecked)
        if not pairs:
            break
        mid, inc, ch, gap = pairs[0]
        run.rechecked[(mid, inc, ch)] = run.rechecked.get((mid, inc, ch), 0) + 1
        last = {(m.model_id, m.setup): i for i, m in enumerate(run.new)}
        order = (inc, ch) if last.get((mid, inc), -1) > last.get((mid, ch), -1) else (ch, inc)
        shares = [max(MIN_SHARE_SECONDS, run.walls.get((mid, s), MIN_SHARE_SECONDS)) for s in order]
        if time.monotonic() + sum(shares) > run.deadline:
            run.log(f"probe: no time left to measure {setup_label(ch)} ({gap:.0%} faster) and the speed model's "
                    f"pick again")
            break
        predicted = {m.setup: m.predicted_step_seconds for m in req.measured_steps if m.model_id == mid}
        run.rechecks += 1
        got = [m for s, share in zip(order, shares)
               if (m := run.measure(req, models[mid], s, predicted[s], share, run.deadline, what="measuring again"))]
        if not got:
            break
        req = mm.with_measurements(req, got)
        result, searches = mm.plan_searched(req)
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
        others = [m for s, m in measured.items() if s in ranked and s != b.setup and not m.lower_bound]
        runner_up = min(others, key=lambda m: m.step_seconds, default=None)
        error = failed.get((mp.model_id, b.setup))
        out.append((mp, mm.decide(mp.mode, b.setup, ranked.get(b.setup, b.speed.step_seconds), mp.setup,
                                  ranked.get(mp.setup, mp.speed.step_seconds), measured, runner_up,
                                  pick_error=error)))
    return out


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


# ---------------------------------------------------------------------------------------------
# storing what it learned
def _store(req, result, fingerprint: str, key: str, path: Path | None, decisions: list) -> str:
    """This probe's measurements (each setting's median and spread) as `probe_steps`, its decisions
    as `probe_decisions`, and the balanced (else first) pick's measured / predicted ratio as a
    calibration sample (a busy machine's flagged and never applied: calibration.py)."""
    from trainfit.core.speed import predict_step
    from trainfit.train import calibration as cal

    load = cal.check_load()
    mine = [m for m in req.measured_steps if m.source == "probe"]
    where = record_probe_steps(fingerprint, key, mine, load, path, decisions=decisions)
    measured = {(m.model_id, m.setup): m for m in req.measured_steps}
    picks = sorted((mp for mp in result.modes if mp.fits and mp.setup is not None),
                   key=lambda mp: mp.mode != "balanced")
    for mp in picks:
        m = measured.get((mp.model_id, mp.setup))
        if m is None or m.lower_bound:
            continue
        predicted = predict_step(mp.model, mp.setup, req.hardware).step_seconds
        cal.record_verify_sample(fingerprint, key, {
            "model": mp.model_id, "method": mp.setup.method, "memory_ratio": None,
            "step_time_ratio": m.step_seconds / predicted, "micro_batch": mp.setup.micro_batch,
            "seq_len": mp.setup.seq_len, "source": "plan probe"}, path, load=load)
        break
    return str(where) + (f" (busy machine: {load.reason})" if load.contended else "")


def record_probe_steps(fingerprint: str, key: str, steps: list, load, path: Path | None = None,
                       decisions: list = ()) -> Path:
    from trainfit.core.serde import to_jsonable
    from trainfit.files import write_atomic
    from trainfit.train import calibration as cal

    path = path or cal.calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cal._read(path)
    rec = data["machines"].setdefault(fingerprint, {}).setdefault(key, {"samples": []})
    now = time.time()
    entries = [{"time": now, "model": m.model_id, "setup": to_jsonable(m.setup), "step_seconds": m.step_seconds,
                "predicted_step_seconds": m.predicted_step_seconds, "lower_bound": m.lower_bound,
                "spread": m.spread, "samples_seconds": list(m.samples or (m.step_seconds,)),
                "load_average_1m": load.load_average_1m, "cores": load.cores, "contended": load.contended}
               for m in steps]
    rec["probe_steps"] = (rec.get("probe_steps", []) + entries)[-MAX_STORED_STEPS:]
    if decisions:  # why each pick is what it is, with the evidence (read by people, not by the planner)
        rec["probe_decisions"] = (rec.get("probe_decisions", []) + [
            {"time": now, "mode": d.mode, "action": d.action, "text": d.text, "faster_by": d.faster_by,
             "spread": d.spread, "repeats": d.repeats, "contended": load.contended} for d in decisions]
        )[-MAX_STORED_STEPS:]
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


def load_probe_steps(fingerprint: str, key: str, path: Path | None = None) -> list:
    """An earlier plan's probe measurements on this machine (recent, taken while it was not busy)."""
    from trainfit.core.plan.measured import MeasuredStep
    from trainfit.core.serde import from_jsonable
    from trainfit.train import calibration as cal

    rec = cal._read(path or cal.calibration_path())["machines"].get(fingerprint, {}).get(key, {})
    out: dict[tuple, Any] = {}
    for e in rec.get("probe_steps", []) if isinstance(rec, dict) else []:
        try:
            if e.get("contended") or time.time() - e["time"] > STORED_MAX_AGE_SECONDS:
                continue
            setup = from_jsonable(TrainingSetup, e["setup"])
            samples = tuple(float(x) for x in e.get("samples_seconds", ()))
            out[(e["model"], setup)] = MeasuredStep(e["model"], setup, float(e["step_seconds"]),
                                                     float(e["predicted_step_seconds"]), bool(e["lower_bound"]),
                                                     source="stored", spread=float(e.get("spread", 0.0)),
                                                     samples=samples)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # an entry from another version: ignored, never fatal
    return list(out.values())


# ---------------------------------------------------------------------------------------------
# the child: builds and times one setting per line on stdin
def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def child_main(warm_spec: str | None = None) -> int:
    import torch  # noqa: F401  (the imports are most of the start-up time: before "ready")
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    _warm_up_torch()
    if warm_spec is not None:  # import the model's code now, while the parent still plans
        try:
            from trainfit.core.serde import from_jsonable
            from trainfit.train.hf_config import build_hf_config

            AutoModelForCausalLM._model_mapping[type(build_hf_config(from_jsonable(ModelSpec, json.loads(warm_spec))))]
        except Exception:  # only a head start: the setting's own build reports any real problem
            pass
    _emit(event="ready")
    for line in sys.stdin:
        job = json.loads(line)
        try:
            _run_setting(job)
        except Exception as exc:  # one setting that cannot run here must not end the probe
            _emit(event="error", index=job.get("index"), message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                  if str(exc) else type(exc).__name__)
    return 0


def _warm_up_torch() -> None:
    """A few small ops in each precision, forward and backward: the first setting measured must not
    pay the process's one-time set-up (thread pools, oneDNN / cuBLAS handles) that the others skip."""
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = torch.randn(256, 256, device=device, requires_grad=True)
        for dtype in (torch.bfloat16, None):
            with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                y = torch.nn.functional.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
                (x @ x + y[0, 0]).float().sum().backward()


def _run_setting(job: dict) -> None:
    import contextlib
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.core.serde import from_jsonable
    from trainfit.train.hf_config import build_hf_config

    spec = from_jsonable(ModelSpec, job["spec"])
    s = from_jsonable(TrainingSetup, job["setup"])
    index = job["index"]
    device = torch.device(job["device"] if job["device"] != "cuda" or torch.cuda.is_available() else "cpu")
    if s.quant != "none" or s.offload != "none" or s.zero_stage or s.num_gpus > 1:
        raise ValueError("the probe runs one process on one device without quantisation or offload")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    attn = {"flash": "flash_attention_2"}.get(s.attention, s.attention)
    hf_cfg = build_hf_config(spec)
    hf_cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attn)
    if s.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if s.precision == "bf16" else torch.float16)
    model = model.to(device)
    ref = None
    if s.method == "dpo" and s.dpo_reference == "separate":
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    if s.lora is not None:
        from peft import LoraConfig, get_peft_model

        from trainfit.export.peft_config import lora_kwargs

        model = get_peft_model(model, LoraConfig(**lora_kwargs(s.lora, dora=s.dora)))
    if s.grad_checkpointing != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if s.lora is not None:
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(s, params, device)
    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(s.precision)
    autocast = (lambda: torch.autocast(device.type, dtype=half)) if half is not None else contextlib.nullcontext
    rows = s.micro_batch * (2 if s.method == "dpo" else 1)  # DPO: chosen + rejected
    vocab = getattr(hf_cfg.get_text_config(), "vocab_size", spec.vocab_size)
    batch = torch.randint(0, vocab, (rows, s.seq_len), device=device)
    sync()
    _emit(event="built", index=index)
    share = float(job["share_seconds"])
    built_at = time.monotonic()
    deadline = built_at + share

    def micro() -> float:
        t = time.perf_counter()
        with autocast():
            loss = model(input_ids=batch, labels=batch).loss
            if s.method == "dpo":
                with torch.no_grad():
                    if ref is not None:
                        ref_loss = ref(input_ids=batch, labels=batch).loss
                    elif s.lora is not None and s.dpo_reference == "lora-base":
                        with model.disable_adapter():
                            ref_loss = model(input_ids=batch, labels=batch).loss
                    else:
                        ref_loss = torch.zeros((), device=device)
                loss = -torch.nn.functional.logsigmoid(0.1 * (ref_loss - loss))
        loss.backward()
        sync()
        return time.perf_counter() - t

    def step() -> float:
        t = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t

    _warm_up_setting(index, micro, step, built_at, share)
    micro_s, optim_s = [], []
    while len(micro_s) < TIMED_MICRO_BATCHES or len(optim_s) < TIMED_OPTIMIZER_STEPS:
        spent_micro = statistics.median(micro_s) if micro_s else 0.0
        now = time.monotonic()
        if now >= deadline or (micro_s and optim_s and now + spent_micro > deadline):
            break  # its share is spent: stop here rather than be stopped (a restart costs the next setting)
        micro_s.append(micro())
        _emit(event="micro", index=index, seconds=micro_s[-1], warmup=False)
        if len(optim_s) < TIMED_OPTIMIZER_STEPS:
            optim_s.append(step())
            _emit(event="optimizer", index=index, seconds=optim_s[-1], warmup=False)
    _emit(event="done", index=index, micro_seconds=micro_s, optimizer_seconds=optim_s)
    del params, batch
    _release(model, ref, optimizer, device)


def _warm_up_setting(index: int, micro, step, built_at: float, share_seconds: float) -> None:
    """Untimed micro-batches and optimizer steps until the setting runs settled (settled_after), at
    most WARMUP_MAX and WARMUP_SHARE of its time share (the rest is for the timed ones)."""
    previous: tuple[float, int | None] | None = None
    for _ in range(WARMUP_MAX):
        faults0 = _page_faults()
        seconds = micro()
        faults = None if faults0 is None else _page_faults() - faults0  # type: ignore[operator]
        _emit(event="micro", index=index, seconds=seconds, warmup=True, faults=faults)
        _emit(event="optimizer", index=index, seconds=step(), warmup=True)
        if settled_after(previous, (seconds, faults)):
            return
        if time.monotonic() - built_at > WARMUP_SHARE * share_seconds:
            return
        previous = (seconds, faults)


def settled_after(previous: tuple[float, int | None] | None, latest: tuple[float, int | None]) -> bool:
    """A warm-up micro-batch (seconds, minor page faults) shows the setting settled: it was not much
    faster than the one before (SETTLED_SPEEDUP) and its page faults no longer grew the memory (at
    most half the previous one's, or under SETTLED_FAULT_PAGES). The first one never does."""
    if previous is None:
        return False
    (before, faults_before), (now, faults_now) = previous, latest
    if now < SETTLED_SPEEDUP * before:
        return False
    if faults_now is None or faults_before is None:
        return True
    return faults_now <= max(SETTLED_FAULT_PAGES, faults_before / 2)


def _page_faults() -> int | None:
    """Minor page faults of this process so far (None where the platform has no getrusage)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _release(*objects) -> None:
    import gc

    import torch

    device = objects[-1]
    del objects
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _optimizer(s: TrainingSetup, params: list, device):
    import torch

    if s.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, fused=True if device.type == "cuda" else None)
    if s.optimizer in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9 if s.optimizer == "sgd-momentum" else 0.0)
    if s.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit"):
        import bitsandbytes as bnb

        cls = {"adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
               "paged-adamw-32bit": bnb.optim.PagedAdamW32bit}[s.optimizer]
        return cls(params, lr=1e-5)
    raise ValueError(f"optimizer {s.optimizer} is not one the probe runs")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"] and len(sys.argv) <= 3:
        raise SystemExit(child_main(*sys.argv[2:]))
    raise SystemExit("usage: python -m trainfit.train.probe --child (the plan's measuring process)")
