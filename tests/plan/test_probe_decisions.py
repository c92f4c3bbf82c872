"""The probe's decision rule: noisy measurements never move the pick off the speed model's, a real
gap does, finalists are measured again interleaved, and a skewed speed model still ends on the
measured best. Fake measurements (known truth + noise), no torch."""

import dataclasses
import json

import pytest

from trainfit.core.models.shapes import parse_shape
from trainfit.core.plan import measured as mm
from trainfit.core.plan.planner import PlanRequest, plan, plan_searched
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import predict_step
from trainfit.train import probe
from trainfit.train import probe_child
from trainfit.train import probe_session
from trainfit.train import probe_store

SPEC = parse_shape("layers=2,hidden=128,heads=2,vocab=512")
A = TrainingSetup(method="pretrain", micro_batch=8, seq_len=128)
B = dataclasses.replace(A, micro_batch=4, grad_accum=2)


@pytest.fixture
def req(fixture_machine):
    hw = fixture_machine("cpu-only-vm")
    return PlanRequest(hardware=hw, method="pretrain", model=SPEC, seq_len=128, target_batch=8,
                       memory_budget_bytes=2 << 30, dataset_tokens=1_000_000)


def step(setup, seconds, spread=0.0, samples=()):
    return mm.MeasuredStep(SPEC.id, setup, seconds, 1.0, spread=spread, samples=samples or (seconds,))


# ---------------------------------------------------------------------------------------------
# the rule
def test_a_challenger_faster_within_the_spread_does_not_move_the_pick():
    d = mm.decide("balanced", A, 1.0, B, 0.97, {A: step(A, 1.0, spread=0.08), B: step(B, 0.97, spread=0.05)})
    assert d.action == "kept" and d.pin and d.pick == A
    assert d.faster_by == pytest.approx(1 / 0.97 - 1) and d.spread == pytest.approx(0.08)
    assert "kept the speed model's pick" in d.text and "3% faster, within the 8% spread" in d.text


def test_a_gap_beyond_the_spread_switches_and_says_by_how_much():
    d = mm.decide("balanced", A, 1.0, B, 0.7, {A: step(A, 1.0, spread=0.08), B: step(B, 0.7, spread=0.05)})
    assert d.action == "switched" and not d.pin and d.pick == B
    assert "43% faster" in d.text and "beyond the 8% spread" in d.text


def test_without_measured_noise_a_few_per_cent_never_switch():
    d = mm.decide("balanced", A, 1.0, B, 0.98, {A: step(A, 1.0), B: step(B, 0.98)})
    assert d.action == "kept" and d.spread == mm.MIN_SPREAD
    d = mm.decide("balanced", A, 1.0, B, 0.9, {A: step(A, 1.0), B: step(B, 0.9)})
    assert d.action == "switched"


def test_a_pair_the_speed_model_misjudged_beyond_its_error_is_decided_by_the_measurements():
    """Measured once each, a 21 % gap within a 25 % spread: kept where the speed model predicted the
    pair within its error; switched where it predicted its pick 26x faster (a kernel it is wrong
    about), its word being all that keeping the pick would rest on."""
    right = {A: mm.MeasuredStep(SPEC.id, A, 0.8, 0.75, spread=0.05), B: mm.MeasuredStep(SPEC.id, B, 0.66, 0.7,
                                                                                       spread=0.25)}
    assert mm.model_misjudged(right[A], right[B]) is None
    d = mm.decide("balanced", A, 0.8, B, 0.66, right)
    assert d.action == "kept" and d.spread == pytest.approx(0.25)
    wrong = {A: dataclasses.replace(right[A], predicted_step_seconds=0.0326),
             B: dataclasses.replace(right[B], predicted_step_seconds=0.864)}
    assert mm.model_misjudged(wrong[A], wrong[B]) == pytest.approx((0.8 / 0.66) / (0.0326 / 0.864))
    d = mm.decide("balanced", A, 0.8, B, 0.66, wrong)
    assert d.action == "switched" and d.spread == mm.MIN_SPREAD
    assert "beyond the 3% margin of a tie" in d.text and "misjudged this pair 32x" in d.text
    # a misjudgement within the error band widened by the spread is no misjudgement
    near = {A: dataclasses.replace(right[A], predicted_step_seconds=0.66), B: right[B]}
    assert mm.model_misjudged(near[A], near[B]) is None  # 1.28x < 1.35 x 1.25


def test_an_estimated_side_must_be_beaten_by_the_speed_model_error():
    near = mm.decide("balanced", A, 1.0, B, 0.9, {A: step(A, 1.0, spread=0.02)})  # B class-scaled, 11 % faster
    assert near.action == "kept" and near.spread == mm.SPEED_MODEL_ERROR and "not measured to the end" in near.text
    far = mm.decide("balanced", A, 1.0, B, 0.5, {A: step(A, 1.0, spread=0.02)})
    assert far.action == "switched"
    # the speed model's pick unmeasured, its class measured 3x slower: the measured challenger wins
    d = mm.decide("balanced", A, 3.0, B, 1.0, {B: step(B, 1.0, spread=0.05)})
    assert d.action == "switched" and "the speed model's pick not measured to the end" in d.text
    bound = dataclasses.replace(step(A, 1.0), lower_bound=True)  # "at least 1.0" ranks at 1.0 x BAND
    d = mm.decide("balanced", A, 1.0 * mm.BAND, B, 0.99, {A: bound, B: step(B, 0.99)})
    assert d.action == "switched"


def test_two_estimates_never_move_the_pick_and_a_pick_that_cannot_run_always_does():
    bound = dataclasses.replace(step(A, 11.3), lower_bound=True)  # a busy machine: nothing finished
    other = dataclasses.replace(step(B, 3.0), lower_bound=True)
    d = mm.decide("balanced", A, 11.3 * mm.BAND, B, 3.1, {A: bound, B: other})
    assert d.action == "kept" and d.pin and "neither it nor" in d.text
    d = mm.decide("balanced", A, 1.0, B, 1.2, {B: step(B, 1.2)}, pick_error="ImportError: flash_attn")
    assert d.action == "switched" and "could not run here (ImportError: flash_attn)" in d.text


def test_a_confirmed_pick_names_the_runner_up_and_its_gap():
    d = mm.decide("balanced", A, 1.0, A, 1.0, {A: step(A, 1.0), B: step(B, 1.2)}, runner_up=step(B, 1.2))
    assert d.action == "confirmed" and "20% slower" in d.text


def test_measured_again_the_faster_by_more_than_a_tie_wins_whatever_the_spread():
    """Both finalists measured twice: the speed model has no say beyond a tie (it was just shown
    wrong on this pair); measured once, the gap must clear the measurements' spread."""
    twice_a = step(A, 1.0, spread=0.2, samples=(1.0, 1.25))
    twice_b = step(B, 0.95, spread=0.06, samples=(0.95, 1.0))
    d = mm.decide("balanced", A, 1.0, B, 0.95, {A: twice_a, B: twice_b})
    assert d.action == "switched" and d.spread == mm.MIN_SPREAD
    assert "beyond the 3% margin of a tie" in d.text and "2 interleaved measurements each, the faster" in d.text
    tie = mm.decide("balanced", A, 1.0, B, 0.98, {A: twice_a, B: step(B, 0.98, spread=0.06, samples=(0.98, 1.0))})
    assert tie.action == "kept" and "within the 3% margin of a tie" in tie.text
    once = mm.decide("balanced", A, 1.0, B, 0.95, {A: step(A, 1.0, spread=0.2), B: twice_b})
    assert once.action == "kept" and once.spread == pytest.approx(0.2)


def test_a_checkpointed_setting_is_at_least_as_slow_as_its_measured_twin(req):
    """Checkpointing only adds work: the probe shortlists a checkpointed setting whose twin without it
    fits after the others, and once the twin is measured the checkpointed one ranks no faster and
    is not measured."""
    searched, searches = plan_searched(req)
    fits = {c.setup for c in searches["balanced"][1]}
    order = [mm.checkpoint_free_twin(c.setup) in fits for c in mm.shortlist(req, searches)]
    assert order == sorted(order) and not order[0]  # the dominated ones, if any, last
    pick = searched.modes[1].setup
    assert pick.grad_checkpointing == "none"
    ckpt = dataclasses.replace(pick, grad_checkpointing="full")
    assert mm.checkpoint_free_twin(ckpt) == pick and mm.checkpoint_free_twin(pick) is None
    slow = dataclasses.replace(req, measured_steps=(mm.MeasuredStep(SPEC.id, pick, 50.0, 1.0),))
    seconds, how = mm.adjusted_step(slow, SPEC.id, ckpt, predict_step(SPEC, ckpt, req.hardware).step_seconds)
    assert how == "twin" and seconds == 50.0
    _, searches = plan_searched(slow)
    assert all(c.setup.grad_checkpointing == "none" or mm.checkpoint_free_twin(c.setup) != pick
               for c in mm.shortlist(slow, searches))
    assert any(c.setup == ckpt for c in searches["balanced"][1])  # it fits: left out by the rule, not the search


def test_a_checkpointed_setting_is_at_least_its_twins_class_scaled_figure(req):
    """The twin unmeasured but its kernel class measured (another micro-batch): the checkpointed
    setting ranks at least at the twin's prediction scaled by that class's ratio, in the search and
    in the plan's figures, and is not shortlisted while that puts it out of the band."""
    searched, searches = plan_searched(req)
    pick = searched.modes[1].setup
    twin = next(c.setup for c in searches["balanced"][1] if c.setup != pick and c.setup.grad_checkpointing == "none"
                and mm.kernel_class(c.setup) == mm.kernel_class(pick))
    ckpt = dataclasses.replace(twin, grad_checkpointing="full")
    p_pick = predict_step(SPEC, pick, req.hardware).step_seconds
    slow = dataclasses.replace(req, measured_steps=(mm.MeasuredStep(SPEC.id, pick, 20 * p_pick, p_pick),))
    p_twin, p_ckpt = (predict_step(SPEC, s, req.hardware).step_seconds for s in (twin, ckpt))
    seconds, how = mm.adjusted_step(slow, SPEC.id, ckpt, p_ckpt, predict_twin=lambda t: p_twin)
    assert how == "twin" and seconds == pytest.approx(20 * p_twin)
    assert mm.adjusted_step(slow, SPEC.id, ckpt, p_ckpt) == (pytest.approx(p_ckpt), "predicted")  # no twin figure
    run = mm.predict_run(slow, SPEC, ckpt, None)
    assert run.speed.step_seconds == pytest.approx(20 * p_twin) and "scaled by its measured ratio" in run.notes[-1]
    _, searches = plan_searched(slow)
    ranked = {c.setup: c.speed.step_seconds for c in searches["balanced"][1]}
    assert ranked[ckpt] == pytest.approx(20 * p_twin)
    assert all(c.setup.grad_checkpointing == "none" or mm.kernel_class(mm.checkpoint_free_twin(c.setup))
               != mm.kernel_class(pick) for c in mm.shortlist(slow, searches))


def test_repeats_pool_to_the_faster_of_two_and_their_disagreement_counts_as_spread():
    first = step(A, 1.0, spread=0.04)
    again = mm.pooled(first, step(A, 1.2, spread=0.02))
    # of two, the faster: noise only slows a measurement (a cold first one read 28 % slow)
    assert again.samples == (1.0, 1.2) and again.step_seconds == pytest.approx(1.0) and again.repeats == 2
    assert again.spread == pytest.approx(0.2)  # the repeats' range beats either one's own spread
    third = mm.pooled(again, step(A, 1.05, spread=0.3))
    # three: twice the median absolute deviation (one outlier moves it little), the median own spread
    assert third.step_seconds == pytest.approx(1.05) and third.spread == pytest.approx(2 * 0.05 / 1.05)
    assert mm.pooled(third, step(A, 1.06, spread=0.5)).spread == pytest.approx((0.04 + 0.3) / 2)  # own: median
    bound = dataclasses.replace(step(A, 2.0), lower_bound=True)
    assert mm.pooled(bound, first) is first and mm.pooled(first, bound) is first  # complete beats "at least"
    stored = dataclasses.replace(first, source="stored")
    assert mm.pooled(stored, again) is again  # another plan's measurement is replaced, not pooled


def test_a_kept_pick_is_ranked_first_by_the_final_plan(req):
    searched, searches = plan_searched(req)
    pick = searched.modes[1].setup
    second = next(c.setup for c in searches["balanced"][1] if c.setup != pick)
    p = searched.modes[1].speed.step_seconds
    measured = (mm.MeasuredStep(SPEC.id, pick, p, p, spread=0.1),
                mm.MeasuredStep(SPEC.id, second, p * 0.95, predict_step(SPEC, second, req.hardware).step_seconds))
    faster = plan(dataclasses.replace(req, measured_steps=measured, measured_settle=True))
    assert faster.modes[1].setup == second  # the measured ranking alone would switch
    pinned = plan(dataclasses.replace(req, measured_steps=measured, measured_settle=True,
                                      measured_pins=(("balanced", SPEC.id, pick),)))
    assert pinned.modes[1].setup == pick
    assert pinned.modes[1].speed.step_seconds == pytest.approx(p)  # its own measured figure, not the other's


# ---------------------------------------------------------------------------------------------
# the loop, with fake measurements
class NoisySession:
    """Measures by the speed model's own prediction (so its pick is truly the fastest) plus noise:
    the first setting of the process reads `first_bias` slow (a cold process), and each measurement
    is off by a deterministic +-`noise` and reports `noise` as its spread."""

    def __init__(self, hw, truth=None, first_bias=0.2, noise=0.04):
        self.hw, self.truth, self.first_bias, self.noise, self.jobs = hw, truth, first_bias, noise, []

    def launch(self):
        pass

    def ready(self, deadline):
        return True

    def close(self):
        pass

    def measure(self, job, deadline):
        self.jobs.append(job)
        seconds = (self.truth or (lambda spec, s, hw: predict_step(spec, s, hw).step_seconds))(job.spec, job.setup,
                                                                                                self.hw)
        wobble = self.noise * (1 if len(self.jobs) % 2 else -1)
        res = probe_session.SettingResult(job.index)
        res.step_seconds = seconds * (1 + wobble) * (1 + (self.first_bias if len(self.jobs) == 1 else 0.0))
        res.spread, res.how = self.noise, "fake"
        return res


def test_a_cold_first_measurement_is_measured_again_and_the_speed_models_pick_kept(req, tmp_path):
    session = NoisySession(req.hardware)
    before = plan(req)
    result, report = probe.confirm_plan(req, seconds=30, session=session, store=False)
    balanced = next(p for p in report.picks if p["mode"] == "balanced")
    assert result.modes[1].setup == before.modes[1].setup  # the truth's fastest, the speed model's pick
    assert report.rechecks >= 1
    labels = [probe.setup_label(j.setup) for j in session.jobs]
    pick, challenger = balanced["speed_model_pick"], balanced["decision"]["challenger"]
    # A B B A: the challenger measured again first, then the speed model's pick
    first_a, first_b = labels.index(pick), labels.index(challenger)
    assert first_a < first_b
    assert any(labels[i:i + 2] == [challenger, pick] for i in range(first_b + 1, len(labels) - 1))
    assert balanced["decision"]["action"] in ("kept", "confirmed")
    # measured again, then once more while the pair stayed within the noise (a confirmation too)
    assert balanced["decision"]["repeats"][pick] in (2, 3)
    measured = {m["setup"]: m for m in report.measurements}
    samples = measured[pick]["samples_seconds"]
    assert measured[pick]["repeats"] == len(samples) >= 2 and max(samples) / min(samples) - 1 >= 0.2  # the cold read
    assert measured[pick]["spread"] > 0.04  # more than one measurement's own: the repeats disagree
    json.dumps(report.picks)  # the evidence goes into the plan's JSON as it is


def test_without_the_recheck_the_cold_first_measurement_would_have_switched(req):
    """The same fake machine, judged on first measurements only: the challenger ranks ahead, which
    is what the re-measurement above corrects."""
    session = NoisySession(req.hardware)
    steps = []
    for s in (plan(req).modes[1].setup, *[c.setup for c in plan_searched(req)[1]["balanced"][1][1:3]]):
        job = probe_session.ProbeJob(len(session.jobs), SPEC, s, 5.0, "cpu")
        steps.append(mm.MeasuredStep(SPEC.id, s, session.measure(job, 0).step_seconds, 1.0))
    raw = plan(dataclasses.replace(req, measured_steps=tuple(steps)))
    assert raw.modes[1].setup != plan(req).modes[1].setup


@pytest.mark.parametrize("knob, value, skew, slowdown", [
    ("precision", "bf16-mixed", 0.02, 2.0),  # bf16 truly 43 % slower than fp32 here
    ("attention", "eager", 0.05, 1.3),
])
def test_with_noise_and_a_skewed_speed_model_the_probe_still_ends_on_the_measured_best(req, knob, value, skew,
                                                                                       slowdown):
    def truth(spec, s, hw):
        base = predict_step(spec, s, hw).step_seconds
        return base * (slowdown if str(getattr(s, knob)) == value else 1.0)

    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew(knob, value, skew),))
    session = NoisySession(req.hardware, truth=truth, first_bias=0.1, noise=0.04)
    result, report = probe.confirm_plan(skewed, seconds=60, session=session, store=False)
    _, searches = plan_searched(dataclasses.replace(req, modes=("balanced",)))
    best = min((c.setup for c in searches["balanced"][1]), key=lambda s: truth(SPEC, s, req.hardware))
    assert result.modes[1].setup == best
    decision = next(p for p in report.picks if p["mode"] == "balanced")["decision"]
    assert decision["action"] == "switched" and decision["faster_by"] > decision["spread"]


def test_the_decisions_are_stored_with_the_measurements_spread(req, tmp_path, monkeypatch):
    from trainfit.train import calibration as cal

    monkeypatch.setattr(cal, "check_load", lambda *a, **k: cal.LoadCheck(0.1, 2, False, None))
    path = tmp_path / "calibration.json"
    first, report = probe.confirm_plan(req, seconds=30, session=NoisySession(req.hardware), calibration_file=path)
    assert report.rechecks >= 1
    rec = next(iter(json.loads(path.read_text())["machines"].values()))["cpu"]
    assert any(e["spread"] > 0 and len(e["samples_seconds"]) >= 2 for e in rec["probe_steps"])
    assert {d["mode"] for d in rec["probe_decisions"]} >= {"balanced"}
    assert all(d["text"] for d in rec["probe_decisions"])
    again = probe_store.load_probe_steps(cal.machine_fingerprint(req.hardware), "cpu", path)
    assert any(m.repeats >= 2 and m.spread > 0 for m in again)

    class NoMeasuring(NoisySession):
        def measure(self, job, deadline):
            raise AssertionError(f"measured {probe.setup_label(job.setup)}: the stored measurements decide")

    second, next_report = probe.confirm_plan(req, seconds=30, session=NoMeasuring(req.hardware), calibration_file=path)
    assert not next_report.ran and next_report.confirmed
    assert [m.setup for m in second.modes] == [m.setup for m in first.modes]  # the same decisions, from the file
    assert [p.get("decision", {}).get("action") for p in next_report.picks] == \
        [p.get("decision", {}).get("action") for p in report.picks]


# ---------------------------------------------------------------------------------------------
# the measurement
def test_warm_up_runs_until_a_micro_batch_is_no_faster_and_faults_no_more_memory():
    assert not probe_child.settled_after(None, (1.0, 0))  # one warm-up never settles
    assert not probe_child.settled_after((1.0, 0), (0.8, 0))  # still getting faster
    assert not probe_child.settled_after((0.93, 176_000), (0.84, 119_000))  # both: faster and faulting
    assert not probe_child.settled_after((0.84, 119_000), (0.83, 100_000))  # memory still growing
    assert probe_child.settled_after((0.84, 119_000), (0.80, 6_000))
    assert probe_child.settled_after((0.55, 20_000), (0.56, 9_000))
    assert probe_child.settled_after((0.55, None), (0.56, None))  # no getrusage: time alone


def test_a_measurements_spread_is_robust_to_one_stall():
    assert probe_session.micro_spread([1.0]) == 0.0
    assert probe_session.micro_spread([1.0, 1.1]) == pytest.approx(0.1 / 1.05)  # two: their range
    steady = probe_session.micro_spread([1.0, 1.02, 0.98, 1.01])
    stalled = probe_session.micro_spread([1.0, 1.02, 0.98, 5.0])
    assert steady < 0.05 and stalled < 0.05  # the range would be 400 %, the interquartile range 100 %
    assert probe_session.micro_spread([1.0, 1.3, 0.8, 1.1]) > 0.2  # noise throughout shows


def test_a_step_figure_from_fewer_than_two_timed_micro_batches_counts_as_noisy():
    job = probe_session.ProbeJob(0, SPEC, B, 5.0, "cpu")  # accumulation 2
    one = probe_session.SettingResult(0, micro_seconds=[1.0], optimizer_seconds=[0.1], warm_micro=[2.0])
    assert probe_session._finish(one, job, None, stopped=True).spread == probe_session.UNTIMED_SPREAD
    four = probe_session.SettingResult(0, micro_seconds=[1.0, 1.02, 0.98, 1.0], optimizer_seconds=[0.1, 0.3, 0.1],
                               warm_micro=[2.0, 1.1])
    done = probe_session._finish(four, job, None, stopped=False)
    assert done.step_seconds == pytest.approx(2 * 1.0 + 0.1) and done.spread < 0.05
    assert "2 warm-up + 4 timed micro-batches" in done.how and "spread" in done.how


# ---------------------------------------------------------------------------------------------
# no work done twice
def test_plan_searched_searches_each_mode_once_and_gives_the_searches_plan_used(req, monkeypatch):
    from trainfit.core.plan import mode_plan

    calls = []
    real = mode_plan.search_model
    monkeypatch.setattr(mode_plan, "search_model", lambda *a, **k: calls.append(a[1].mode) or real(*a, **k))
    result, searches = plan_searched(req)
    assert sorted(calls) == sorted(mp.mode for mp in result.modes)
    from trainfit.core.plan.hardware_rules import rules_for
    from trainfit.core.plan.modes import targets

    for mp in result.modes:
        again = real(req, targets(mp.mode), rules_for(req.hardware), SPEC)
        assert [c.setup for c in searches[mp.mode][1]] == [c.setup for c in again.fitting]
        assert searches[mp.mode][1][0].setup == mp.setup


def test_predict_run_predicts_a_step_once(req, monkeypatch):
    from trainfit.core.run import prediction as run_prediction

    calls = []
    real = run_prediction.predict_step
    monkeypatch.setattr(run_prediction, "predict_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    s = plan(req).modes[1].setup
    other = dataclasses.replace(s, precision="fp32" if s.precision != "fp32" else "bf16-mixed")
    m = mm.MeasuredStep(SPEC.id, s, 0.5, 0.25)
    cases = [(req, s), (dataclasses.replace(req, measured_steps=(m,)), s),
             (dataclasses.replace(req, measured_steps=(m,)), dataclasses.replace(s, micro_batch=4, grad_accum=2)),
             (dataclasses.replace(req, measured_steps=(m,), step_time_factor=1.5), other),
             (dataclasses.replace(req, speed_skew=(mm.SpeedSkew("precision", s.precision, 0.5),)), s)]
    for r, setup in cases:
        calls.clear()
        mm.predict_run(r, SPEC, setup, None)
        assert len(calls) == 1
    raw = real(SPEC, s, req.hardware).step_seconds
    assert mm.predict_run(cases[1][0], SPEC, s, None).speed.step_seconds == pytest.approx(0.5)
    assert mm.predict_run(cases[2][0], SPEC, cases[2][1], None).speed.step_seconds == pytest.approx(
        real(SPEC, cases[2][1], req.hardware).step_seconds * 0.5 / 0.25)
    calibrated = mm.predict_run(cases[3][0], SPEC, other, None)  # an unmeasured class: the verify factor
    assert calibrated.step_time_factor == 1.5
    assert mm.predict_run(cases[4][0], SPEC, s, None).speed.step_seconds == pytest.approx(raw * 0.5)


def test_a_confirmation_within_the_noise_is_measured_again_like_a_switch(req):
    """The speed model's pick measured fastest, its runner-up 2 % behind with 5 % spreads: the pair
    is measured again (as a switch would be); 20 % behind, it is not."""
    model_only, searches = plan_searched(req)
    pick = model_only.modes[1].setup
    runner = next(c.setup for c in searches["balanced"][1] if c.setup != pick)
    p = predict_step(SPEC, pick, req.hardware).step_seconds
    p_runner = predict_step(SPEC, runner, req.hardware).step_seconds

    def finalists(behind):
        steps = (mm.MeasuredStep(SPEC.id, pick, p, p, spread=0.05),
                 mm.MeasuredStep(SPEC.id, runner, p * behind, p_runner, spread=0.05))
        measured = dataclasses.replace(req, measured_steps=steps)
        result, found = plan_searched(measured)
        assert result.modes[1].setup == pick
        return probe._finalists(measured, result, model_only, {}, found)

    near = finalists(1.02)
    assert near and near[0][1:3] == (pick, runner) and near[0][3] == pytest.approx(1 / 1.02 - 1)
    assert finalists(1.2) == []


def test_a_kernel_class_not_measured_yet_goes_before_the_time_kept_for_the_finalists(req, monkeypatch):
    """An unmeasured class can be off by the speed model's whole error: no time is kept back from
    measuring it while it could beat the pick by that error; once the next setting's class is
    measured, or it ranks further behind, the finalists' time is kept."""
    searched, searches = plan_searched(req)
    pick = searched.modes[1].setup
    other = next(c.setup for c in searches["balanced"][1] if mm.kernel_class(c.setup) != mm.kernel_class(pick))
    same = next(c.setup for c in searches["balanced"][1] if c.setup != pick
                and mm.kernel_class(c.setup) == mm.kernel_class(pick))
    measured = dataclasses.replace(req, measured_steps=(mm.MeasuredStep(SPEC.id, pick, 1.0, 1.0),))
    monkeypatch.setattr(probe, "_recheck_reserve", lambda *a: 7.0)
    run = probe._Measuring(None, lambda m: None, 0.0)

    at_pick = searched.modes[1].speed.step_seconds

    def cand(s, ranked=at_pick):
        return mm.ProbeCandidate(SPEC, s, 1.0, ("balanced",), ranked)

    def keep(candidate):
        return probe._time_to_keep(measured, searched, searched, run, candidate, searches)

    assert keep(cand(other)) == 0.0
    assert keep(cand(other, at_pick * mm.BAND * 0.99)) == 0.0
    assert keep(cand(other, at_pick * mm.BAND * 1.1)) == 7.0
    assert keep(cand(same)) == 7.0


def test_the_balanced_modes_candidates_are_measured_first(req, monkeypatch):
    """The probe's seconds go to the balanced pick first, then to the other modes' candidates."""
    monkeypatch.setattr(mm, "ROUND_SIZE", 100)
    _, searches = plan_searched(req)
    order = ["balanced" in c.modes for c in mm.shortlist(req, searches)]
    assert order and order == sorted(order, reverse=True)
    assert all(order[:1])


def test_a_kernel_the_speed_model_is_wrong_about_is_measured_once_not_per_checkpointing(req):
    """Every setting of one attention kernel predicted 20x too fast: once it is measured without
    checkpointing, its checkpointed settings rank at least that slow and the probe's seconds go to
    the other kernel, not to them."""
    pick = plan(req).modes[1].setup
    other = "eager" if pick.attention == "sdpa" else "sdpa"
    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew("attention", pick.attention, 0.05),))
    session = NoisySession(req.hardware, first_bias=0.0, noise=0.02)
    result, report = probe.confirm_plan(skewed, seconds=60, session=session, store=False)
    skewed_jobs = [j.setup for j in session.jobs if j.setup.attention == pick.attention]
    assert [s.grad_checkpointing for s in skewed_jobs].count("none") >= 1
    measured_free = {mm.kernel_class(mm.checkpoint_free_twin(s)) for s in skewed_jobs if s.grad_checkpointing != "none"}
    assert not measured_free & {mm.kernel_class(s) for s in skewed_jobs if s.grad_checkpointing == "none"}
    assert any(j.setup.attention == other for j in session.jobs)
    assert result.modes[1].setup == pick  # the truth is the unskewed speed model: its pick is the fastest
