"""The plan's probe: measured step times rank their settings, the probe finds the measured best
when the speed model is deliberately wrong about one knob, stores what it learned, and is skipped
with a reason where it cannot or must not run."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from trainfit.core.models.shapes import parse_shape
from trainfit.core.plan import measured as mm
from trainfit.core.plan.planner import PlanRequest, plan, plan_searched
from trainfit.core.speed import predict_step
from trainfit.train import calibration as cal
from trainfit.train import probe
from trainfit.train import probe_session
from trainfit.train import probe_store

SPEC = parse_shape("layers=2,hidden=128,heads=2,vocab=512")


@pytest.fixture
def req(fixture_machine):
    hw = fixture_machine("cpu-only-vm")
    return PlanRequest(hardware=hw, method="pretrain", model=SPEC, seq_len=128, target_batch=8,
                       memory_budget_bytes=2 << 30, dataset_tokens=1_000_000)


def truth(slow_knob: str, slow_value: str, slowdown: float):
    """This 'machine': the raw speed model, except one knob's value is `slowdown` times slower."""
    def step(spec, setup, hw):
        base = predict_step(spec, setup, hw).step_seconds
        return base * (slowdown if str(getattr(setup, slow_knob)) == slow_value else 1.0)
    return step


class FakeSession:
    """Measures by a known truth instead of running torch (what the loop does with measurements)."""

    def __init__(self, step, hw):
        self.step, self.hw, self.jobs = step, hw, []

    def launch(self):
        pass

    def ready(self, deadline):
        return True

    def close(self):
        pass

    def measure(self, job, deadline):
        self.jobs.append(job)
        res = probe_session.SettingResult(job.index)
        res.step_seconds, res.how = self.step(job.spec, job.setup, self.hw), "fake"
        return res


class NoMeasuring(FakeSession):
    def measure(self, job, deadline):
        raise AssertionError(f"measured {probe.setup_label(job.setup)} although the stored steps confirm the pick")


def best_by_truth(req, step, mode="balanced"):
    """The truly fastest setting that fits the mode (exhaustive, by the truth)."""
    _, fitting = plan_searched(dataclasses.replace(req, modes=(mode,)))[1][mode]
    return min((c.setup for c in fitting), key=lambda s: step(SPEC, s, req.hardware))


def test_a_measured_step_replaces_the_prediction_and_scales_its_kernel_class(req):
    base = plan(req).modes[1]
    s = base.setup
    predicted = base.speed.step_seconds
    m = mm.MeasuredStep(SPEC.id, s, predicted * 3.0, predicted)
    again, searches = plan_searched(dataclasses.replace(req, measured_steps=(m,)))
    searched = dict((c.setup, c.speed.step_seconds) for c in searches["balanced"][1])
    assert searched[s] == pytest.approx(predicted * 3.0)
    sibling = next(x for x in searched if x != s and mm.kernel_class(x) == mm.kernel_class(s))
    raw = predict_step(SPEC, sibling, req.hardware).step_seconds
    assert searched[sibling] == pytest.approx(raw * 3.0)  # its class measured 3x slower than predicted
    # the plan's figures say what was measured when the pick is the measured setting
    picked = [mp for mp in again.modes if mp.setup == s]
    for mp in picked:
        assert mp.speed.step_seconds == pytest.approx(predicted * 3.0)
        assert any("measured on this machine" in r for r in mp.reasons)


@pytest.mark.parametrize("knob, value, skew, slowdown", [
    ("precision", "bf16-mixed", 0.02, 40.0),  # the model thinks bf16 is 50x faster; it is 40x slower
    ("attention", "eager", 0.05, 1.3),  # an attention kernel 20x too fast in the model
    ("grad_checkpointing", "full", 0.1, 1.25),
])
def test_the_probe_finds_the_measured_best_when_the_speed_model_is_wrong_about_one_knob(req, knob, value, skew,
                                                                                        slowdown, tmp_path):
    step = truth(knob, value, slowdown)
    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew(knob, value, skew),))
    wrong = plan(skewed).modes[1].setup
    assert str(getattr(wrong, knob)) == value  # the skew hook does mislead the speed model
    session = FakeSession(step, req.hardware)
    result, report = probe.confirm_plan(skewed, seconds=30, session=session, calibration_file=tmp_path / "c.json")
    balanced = result.modes[1].setup
    assert balanced == best_by_truth(req, step)
    assert str(getattr(balanced, knob)) != value
    assert report.ran and report.confirmed and report.rounds == len(session.jobs) >= 2
    pick = next(p for p in report.picks if p["mode"] == "balanced")
    assert pick["changed"] and pick["speed_model_pick"] == probe.setup_label(wrong)
    assert pick["pick"] == probe.setup_label(balanced)
    assert all(mp.fits for mp in result.modes)


def test_the_probe_never_launches_a_setting_the_memory_model_says_does_not_fit(req):
    session = FakeSession(truth("precision", "bf16-mixed", 40.0), req.hardware)
    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew("precision", "bf16-mixed", 0.02),))
    probe.confirm_plan(skewed, seconds=30, session=session, store=False)
    from trainfit.core.memory import estimate_memory

    limit = 2 << 30  # --memory-budget; the extreme mode's share is the largest (95 %)
    for job in session.jobs:
        need = estimate_memory(SPEC, job.setup, req.hardware).devices[0].needed_bytes
        assert need <= 0.95 * limit


def test_what_the_probe_learned_is_stored_so_the_next_plan_needs_no_probe(req, tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "check_load", lambda *a, **k: cal.LoadCheck(0.1, 2, False, None))
    path = tmp_path / "calibration.json"
    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew("attention", "eager", 0.05),))
    step = truth("attention", "eager", 1.3)
    first, report = probe.confirm_plan(skewed, seconds=30, session=FakeSession(step, req.hardware),
                                       calibration_file=path)
    assert report.ran and str(path) in report.stored
    stored = json.loads(path.read_text())
    device = next(iter(stored["machines"].values()))["cpu"]
    assert len(device["probe_steps"]) == len(report.measurements)
    assert device["samples"][-1]["source"] == "plan probe" and device["samples"][-1]["step_time_ratio"] > 0
    second, again = probe.confirm_plan(skewed, seconds=30, session=NoMeasuring(step, req.hardware),
                                       calibration_file=path)
    assert not again.ran and again.confirmed and "already confirm" in again.skipped
    assert [m.setup for m in second.modes] == [m.setup for m in first.modes]


def test_a_busy_machines_measurements_are_not_reused(req, tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "check_load", lambda *a, **k: cal.LoadCheck(9.0, 2, True, "busy"))
    path = tmp_path / "calibration.json"
    step = truth("attention", "eager", 1.3)
    _, report = probe.confirm_plan(req, seconds=30, session=FakeSession(step, req.hardware), calibration_file=path)
    assert report.ran and "busy" in report.stored
    assert probe_store.load_probe_steps(cal.machine_fingerprint(req.hardware), "cpu", path) == []


def test_without_the_train_extra_the_probe_is_skipped_with_the_reason(req, monkeypatch):
    monkeypatch.setattr(probe, "missing_extra", lambda: "the train extra is not installed (torch missing)")
    result, report = probe.confirm_plan(req, seconds=30)
    assert not report.ran and "train extra" in report.skipped and not report.confirmed
    assert [m.setup for m in result.modes] == [m.setup for m in plan(req).modes]


def test_time_up_leaves_the_pick_unconfirmed_and_says_so(req):
    class Slow(FakeSession):
        def measure(self, job, deadline):
            import time

            time.sleep(2.0)
            return super().measure(job, deadline)

    skewed = dataclasses.replace(req, speed_skew=(mm.SpeedSkew("precision", "bf16-mixed", 0.02),))
    session = Slow(truth("precision", "bf16-mixed", 40), req.hardware)
    _, report = probe.confirm_plan(skewed, seconds=5, session=session, store=False)
    assert 1 <= len(session.jobs) <= 2 and report.ran
    assert not report.confirmed and "time is up" in report.unconfirmed


# ---------------------------------------------------------------------------------------------
# the command
def run_plan(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainfit", "plan", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


TINY = ["shape:layers=2,hidden=64,heads=2,vocab=256", "--method", "pretrain", "--seq-len", "64",
        "--target-batch", "8", "--memory-budget", "1GiB", "--mode", "balanced", "--json"]


@pytest.mark.parametrize("args, env, needle", [
    (["--probe-seconds", "0"], {}, "--probe-seconds"),
    (["--probe-seconds", "nan"], {}, "--probe-seconds"),
    ([], {"TRAINFIT_SPEED_SKEW": "precision=bf16-mixed"}, "TRAINFIT_SPEED_SKEW"),
    ([], {"TRAINFIT_SPEED_SKEW": "colour=red:2"}, "TRAINFIT_SPEED_SKEW"),
])
def test_bad_probe_input_is_one_line_and_exit_2(args, env, needle):
    r = run_plan(*TINY, "--hardware", "cpu", *args, env=env)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_other_hardware_is_never_probed_and_no_probe_says_why():
    r = run_plan(*TINY, "--hardware", "cpu", env={"TRAINFIT_NO_PROBE": ""})
    assert r.returncode == 0, r.stderr
    assert "probe" not in json.loads(r.stdout) and "probe:" not in r.stderr
    r = run_plan(*TINY, "--no-probe", env={"TRAINFIT_NO_PROBE": ""})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["probe"] == {"ran": False, "skipped": "--no-probe", "speed_skew": []}


@pytest.mark.slow
def test_plan_on_this_machine_probes_and_finds_the_measured_best_despite_a_wrong_speed_model(tmp_path):
    """Real steps through the command: the speed model is told gradient checkpointing is 10x
    faster than it is (it recomputes the forward, so it is slower); the probe measures and the
    balanced pick is the fastest setting it measured."""
    env = {"TRAINFIT_NO_PROBE": "", "XDG_CONFIG_HOME": str(tmp_path),
           "TRAINFIT_SPEED_SKEW": "grad_checkpointing=full:0.1"}
    r = run_plan(*TINY, "--probe-seconds", "60", env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    p = doc["probe"]
    assert p["ran"] and p["seconds"] <= 60 + 15 and "probe: measuring" in r.stderr
    pick = p["picks"][0]
    assert " ckpt " in pick["speed_model_pick"]  # the skewed model's pick
    timed = [m for m in p["measurements"] if "error" not in m and not m["lower_bound"]]
    assert pick["pick"] in [m["setup"] for m in timed] or not p["confirmed"]
    measured = {m["setup"]: m["measured_step_seconds"] for m in timed}
    assert all(m["spread"] >= 0 and m["repeats"] == len(m["samples_seconds"]) for m in timed)
    # the skewed model's pick was measured, and the pick changed exactly when something beat it by
    # more than the measurements' spread (the decision says so, with its evidence)
    assert pick["speed_model_pick"] in [m["setup"] for m in p["measurements"]]
    decision = pick["decision"]
    assert pick["changed"] == (decision["action"] == "switched")
    if decision["action"] == "kept":
        assert decision["faster_by"] <= decision["spread"] and "within the" in decision["text"]
    if decision["action"] == "switched" and decision["faster_by"] is not None:
        assert decision["faster_by"] > decision["spread"] and "beyond the" in decision["text"]
    if p["confirmed"] and pick["pick"] in measured:
        fastest = min(measured.values())
        assert decision["action"] == "kept" or measured[pick["pick"]] == fastest
        assert doc["modes"][0]["speed"]["step_seconds"] == pytest.approx(measured[pick["pick"]])
    assert (tmp_path / "trainfit" / "calibration.json").is_file()


def test_a_saved_profile_of_this_machine_is_this_machine_and_another_is_not(tmp_path, fixture_machine, monkeypatch):
    import argparse

    from trainfit.cli import plan_probe
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.serde import to_jsonable
    from trainfit.hardware.profiler import build_profile

    mine, other = tmp_path / "mine.json", tmp_path / "other.json"
    mine.write_text(json.dumps(to_jsonable(build_profile(quick=True))))
    other.write_text(json.dumps(to_jsonable(fixture_machine("desktop-rtx4090"))))
    monkeypatch.delenv("TRAINFIT_NO_PROBE")
    for path, expected in ((mine, None), (other, "planned for other hardware (--hardware), not this machine")):
        args = argparse.Namespace(hardware=str(path), flavor=None, no_probe=False)
        req = PlanRequest(hardware=resolve_hardware(str(path)), method="pretrain", model=SPEC)
        assert plan_probe.why_no_probe(args, req) == expected


def test_unmeasured_classes_get_the_benefit_of_the_doubt_while_probing_and_the_typical_error_at_the_end():
    assert mm.unmeasured_factor({}) == 1.0
    ratios = {("a",): 0.6, ("b",): 6.0, ("c",): 5.0}
    assert mm.unmeasured_factor(ratios) == 0.6  # the machine is faster than the model somewhere
    assert mm.unmeasured_factor({("b",): 6.0}) == 1.0  # one slow class says nothing of the others
    assert mm.unmeasured_factor(ratios, settle=True) == 5.0  # time up: the typical ratio


def test_nothing_that_fits_means_nothing_to_measure(req):
    tiny_budget = dataclasses.replace(req, model=parse_shape("layers=24,hidden=2048,heads=16,vocab=32000"),
                                      memory_budget_bytes=64 << 20)
    result, report = probe.confirm_plan(tiny_budget, seconds=30, session=NoMeasuring(None, req.hardware), store=False)
    assert not any(m.fits for m in result.modes)
    assert not report.ran and not report.confirmed and "nothing to measure" in report.skipped


def test_a_lower_bound_wins_the_final_pick_only_by_the_whole_error_band(req):
    best = plan(req).modes[1]
    s, predicted = best.setup, best.speed.step_seconds
    bound = mm.MeasuredStep(SPEC.id, s, predicted, predicted, lower_bound=True)
    probing = dataclasses.replace(req, measured_steps=(bound,))
    assert mm.adjusted_step(probing, SPEC.id, s, predicted) == (predicted, "measured")
    final = dataclasses.replace(probing, measured_settle=True)
    assert mm.adjusted_step(final, SPEC.id, s, predicted)[0] == pytest.approx(predicted * mm.BAND)


def test_the_shortlist_names_the_leaders_split_neighbours_even_outside_the_band(req):
    """The speed model ranks micro-batch splits of one kernel class by its own figures (a class ratio
    cannot correct them): once the pick's class is measured, the pick's neighbours (micro-batch
    halved or doubled at the same global batch) are measured although predicted outside the band."""
    pick = plan(req).modes[1].setup
    # the pick measured at its prediction; nothing else measured
    predicted = predict_step(SPEC, pick, req.hardware).step_seconds
    req = dataclasses.replace(req, measured_steps=(mm.MeasuredStep(SPEC.id, pick, predicted, predicted),),
                              modes=("balanced",))
    _, searches = plan_searched(req)
    model, fitting = searches["balanced"]
    leader = min((c for c in fitting if c.speed is not None), key=lambda c: c.speed.step_seconds)
    neighbours = mm.split_neighbours(leader, fitting)
    assert neighbours and all(c.setup.micro_batch * c.setup.grad_accum == leader.setup.micro_batch
                              * leader.setup.grad_accum and c.setup.micro_batch != leader.setup.micro_batch
                              for c in neighbours)
    # push every candidate but the leader out of the band: the neighbours stay on the shortlist
    far = [c if c is leader else dataclasses.replace(c, speed=dataclasses.replace(
        c.speed, step_seconds=leader.speed.step_seconds * mm.BAND * 3)) for c in fitting]
    named = {c.setup for c in mm.shortlist(req, {"balanced": (model, far)})}
    assert named and named <= {c.setup for c in neighbours} and leader.setup not in named
