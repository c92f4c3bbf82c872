"""Safety policies of `trainfit train` (train/monitor/safety.py): thermal pause / resume with hysteresis,
battery handling, checkpoint cadence, signals, leftover cleanup.

The policies are driven by a fake machine (readings as a function of a fake clock that training
and pauses advance) through a loop that calls the callbacks in the Trainer's order; the signal
test runs a real tiny CPU training in a subprocess and resumes it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainfit.core.plan.modes import MODES
from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.hardware.sample_types import GpuSample, HostSample, Sample
from trainfit.train.recovery import checkpoints as ck
from trainfit.core.run.checkpoint_cadence import cadence_interval
from trainfit.train.monitor.machine_policies import ThermalPolicy
from trainfit.train.monitor.run_policies import CadencePolicy, SignalPolicy
from trainfit.train.monitor.safety import context_of, safety_callbacks
from trainfit.train.monitor.safety_context import SafetyContext, TrainingStopped

from .conftest import REPO, loss_trajectory, make_config


# ---------------------------------------------------------------------------------------------
# a fake machine and a Trainer-like loop
class Machine:
    """A clock that training steps and pauses advance, and the machine's state over time: the
    GPU heats while training and cools while paused (sleep)."""

    def __init__(self, *, temp=60.0, heat=1.0, cool=0.5, floor=40.0, slowdown=90.0, reasons=(), cpu_temp=None,
                 throttle=None, on_ac=True, battery=None, power_limit=300.0):
        self.t = 0.0
        self.temp, self.heat, self.cool, self.floor = temp, heat, cool, floor
        self.slowdown, self.reasons, self.power_limit = slowdown, tuple(reasons), power_limit
        self.cpu_temp, self.throttle = cpu_temp, throttle
        self.on_ac, self.battery = on_ac, battery
        self.events: list[tuple[float, str]] = []  # (time, what) of every reading taken
        self.script = []  # (time, fn(machine)) applied once the clock passes time

    def clock(self) -> float:
        return self.t

    def _advance(self, seconds: float, rate: float) -> None:
        self.t += seconds
        self.temp = max(self.floor, self.temp + rate * seconds)
        for item in list(self.script):
            if self.t >= item[0]:
                item[1](self)
                self.script.remove(item)

    def train(self, seconds: float) -> None:
        self._advance(seconds, self.heat)

    def sleep(self, seconds: float) -> None:
        self._advance(seconds, -self.cool)

    def at(self, t: float, fn) -> None:
        self.script.append((t, fn))

    def sample(self) -> Sample:
        gpu = GpuSample(index=0, temperature_c=self.temp, slowdown_temperature_c=self.slowdown,
                        throttle_reasons=self.reasons, power_limit_watts=self.power_limit)
        host = HostSample(cpu_temperature_c=self.cpu_temp, cpu_throttle_events=self.throttle, on_ac=self.on_ac,
                          battery_percent=self.battery)
        self.events.append((self.t, "sample"))
        return Sample(time=self.t, host=host, gpus=(gpu,))


def drive(cbs, m: Machine, *, steps: int, step_seconds: float = 1.0, save_seconds: float = 0.5, model=None):
    """Call the callbacks the way Transformers' Trainer does: on_step_begin, the step,
    on_step_end, the save when asked (then on_save), the stop when asked, on_train_end. The last
    step is saved (as trainfit's StopAt does). Returns (state, [(step, clock) of each save])."""
    from transformers import TrainerControl, TrainerState

    state, control, args = TrainerState(max_steps=steps), TrainerControl(), SimpleNamespace(device=None)
    saves = []
    for cb in cbs:
        cb.on_train_begin(args, state, control, model=model)
    while state.global_step < steps:
        control.should_save = False
        for cb in cbs:
            cb.on_step_begin(args, state, control)
        m.train(step_seconds)
        state.global_step += 1
        for cb in cbs:
            cb.on_step_end(args, state, control)
        if state.global_step >= steps:
            control.should_save = True
        if control.should_save:
            m._advance(save_seconds, 0.0)
            saves.append((state.global_step, m.t))
            control.should_save = False
            for cb in cbs:
                cb.on_save(args, state, control)
        if control.should_training_stop:
            break
    for cb in cbs:
        cb.on_train_end(args, state, control)
    return state, saves


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in recs if "event" in r and (kind is None or r["event"] == kind)]


def callbacks(tmp_path, m: Machine, mode="balanced", device="cuda", **overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return safety_callbacks(mode, m.sample, run_dir=tmp_path, device=device, clock=m.clock, sleep=m.sleep,
                            world_size=1, rank=0, handle_signals=False, **overrides)


# ---------------------------------------------------------------------------------------------
# thermal
def test_thermal_ramp_pauses_and_resumes_with_hysteresis(tmp_path):
    m = Machine(temp=70.0, heat=0.5, cool=0.5)  # slowdown 90 C; balanced pauses at 85 C, resumes below 75 C
    cbs = callbacks(tmp_path, m, "balanced")
    state, saves = drive(cbs, m, steps=120)
    assert state.global_step == 120  # the run finished
    pauses, resumes = events(tmp_path, "thermal_pause"), events(tmp_path, "thermal_resume")
    assert len(pauses) == len(resumes) >= 2  # it heats again under load: pause, resume, pause, ...
    pause, resume = pauses[0], resumes[0]
    assert pause["readings"]["gpus"][0]["temperature_c"] >= 85.0
    assert pause["checkpointed"] is False and pause["resume_below_c"] == 75.0
    assert "sudo nvidia-smi -pl 240" in pause["reason"]  # 80 % of the 300 W limit
    assert resume["readings"]["gpus"][0]["temperature_c"] < 75.0
    # hysteresis: not resumed at 84 C; it cooled >= 10 C at 0.5 C/s, then held 30 s
    assert resume["paused_seconds"] >= 10.0 / 0.5 + 30.0
    assert pause["step"] not in [s for s, _ in saves]  # balanced does not checkpoint before a pause
    assert context_of(cbs).paused_seconds == sum(r["paused_seconds"] for r in resumes)


def test_extreme_checkpoints_before_the_pause(tmp_path):
    m = Machine(temp=80.0, heat=0.5, cool=0.5)  # extreme pauses at 88 C
    cbs = callbacks(tmp_path, m, "extreme", max_loss_seconds=10_000)
    state, saves = drive(cbs, m, steps=60)
    pause, = events(tmp_path, "thermal_pause")
    assert pause["checkpointed"] is True and pause["readings"]["gpus"][0]["temperature_c"] >= 88.0
    step, saved_at = saves[0]
    assert step == pause["step"]  # the checkpoint of that step was written before the pause began
    assert events(tmp_path, "thermal_resume") and state.global_step == 60


def test_throttle_reasons_alone_trigger(tmp_path):
    m = Machine(temp=55.0, heat=0.0, cool=0.0, reasons=("sw_power_cap",))
    drive(callbacks(tmp_path, m), m, steps=20)
    assert not events(tmp_path, "thermal_pause")  # a power cap is not heat
    m = Machine(temp=55.0, heat=0.0, cool=0.0, reasons=("hw_slowdown",))
    m.at(12.0, lambda mm: setattr(mm, "reasons", ()))
    drive(callbacks(tmp_path / "b", m), m, steps=20)
    pause, = events(tmp_path / "b", "thermal_pause")
    assert "hw_slowdown" in pause["reason"]
    assert events(tmp_path / "b", "thermal_resume")[0]["paused_seconds"] >= 30.0  # reasons gone, held 30 s


def test_missing_slowdown_threshold_uses_the_assumed_one(tmp_path):
    m = Machine(temp=86.0, heat=0.0, cool=1.0, slowdown=None)
    drive(callbacks(tmp_path, m), m, steps=5)
    pause, = events(tmp_path, "thermal_pause")
    assert "assumed" in pause["reason"] and "90 C" in pause["reason"]


def test_cpu_training_temperature_and_throttle_counters(tmp_path):
    m = Machine(cpu_temp=93.0, heat=0.0, cool=0.0)  # balanced CPU limit 90 C
    m.at(20.0, lambda mm: setattr(mm, "cpu_temp", 70.0))
    drive(callbacks(tmp_path, m, device="cpu"), m, steps=40)
    assert "CPU at 93 C" in events(tmp_path, "thermal_pause")[0]["reason"]
    assert events(tmp_path, "thermal_resume")

    m = Machine(cpu_temp=60.0, throttle=0)
    m.at(3.0, lambda mm: setattr(mm, "throttle", 100))  # 100 events within seconds: throttling
    m.at(40.0, lambda mm: None)
    drive(callbacks(tmp_path / "b", m, device="cpu"), m, steps=60)
    pause, = events(tmp_path / "b", "thermal_pause")
    assert "throttling" in pause["reason"] and pause["readings"]["cpu_throttle_events"] == 100
    assert events(tmp_path / "b", "thermal_resume")  # the counter stopped rising


def test_a_pause_that_never_cools_checkpoints_and_stops(tmp_path):
    m = Machine(temp=95.0, heat=0.0, cool=0.0)
    cbs = callbacks(tmp_path, m, "conservative")  # at most 10 min of pause
    with pytest.raises(TrainingStopped) as exc:
        drive(cbs, m, steps=50)
    assert exc.value.exit_code == 4 and exc.value.step == 1
    assert "still too hot after 10 min of pause" in str(exc.value) and "--resume" in str(exc.value)
    stop, = events(tmp_path, "thermal_stop")
    assert 600.0 <= stop["paused_seconds"] < 606.0


def test_multi_process_runs_only_watch(tmp_path):
    m = Machine(temp=95.0, heat=0.0, cool=0.0)
    cbs = safety_callbacks("balanced", m.sample, run_dir=tmp_path, device="cuda", clock=m.clock, sleep=m.sleep,
                           world_size=2, rank=0)
    state, saves = drive(cbs, m, steps=30)
    assert state.global_step == 30 and [s for s, _ in saves] == [30]  # no pause, no extra checkpoint
    assert len(events(tmp_path, "thermal_warning")) == 1
    assert safety_callbacks("balanced", m.sample, run_dir=tmp_path, world_size=2, rank=1) == []


def test_a_failing_sampler_never_stops_training(tmp_path):
    logged = []

    def broken():
        raise OSError("NVML gone")

    cbs = safety_callbacks(None, broken, run_dir=tmp_path, device="cuda", log=logged.append, handle_signals=False,
                           world_size=1, rank=0)
    m = Machine()
    for cb in cbs:
        cb.ctx.clock, cb.ctx.sleep = m.clock, m.sleep
    state, _ = drive(cbs, m, steps=30)
    assert state.global_step == 30
    assert sum("readings failed" in line for line in logged) == 1
    assert context_of(cbs).thresholds.mode == "balanced"  # no mode in the config


# ---------------------------------------------------------------------------------------------
# power
@pytest.fixture
def torch_threads():
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(4)
    yield torch
    torch.set_num_threads(saved)


def test_battery_lowers_threads_and_checkpoints_more_often(tmp_path, torch_threads):
    m = Machine(on_ac=True, battery=80.0, heat=0.0)
    m.at(100.0, lambda mm: setattr(mm, "on_ac", False))
    seen = []
    m.at(200.0, lambda mm: seen.append(torch_threads.get_num_threads()))
    m.at(300.0, lambda mm: setattr(mm, "on_ac", True))
    cbs = callbacks(tmp_path, m, "balanced", device="cpu")
    drive(cbs, m, steps=400, save_seconds=2.0)
    battery, = events(tmp_path, "power_battery")
    assert battery["threads_before"] == 4 and battery["threads_after"] == 2 and seen == [2]
    assert torch_threads.get_num_threads() == 4  # restored on AC
    assert events(tmp_path, "power_resume")[0]["threads"] == 4
    cadence = {e["risk"]: e["interval_seconds"] for e in events(tmp_path, "checkpoint_cadence")}
    assert cadence["battery"] == pytest.approx(cadence["normal"] / 2)  # Young: sqrt(0.25) = 0.5


def test_low_battery_checkpoints_and_waits_for_ac(tmp_path):
    m = Machine(on_ac=False, battery=50.0, heat=0.0)
    m.at(30.0, lambda mm: setattr(mm, "battery", 19.0))  # balanced: pause at <= 20 %
    m.at(500.0, lambda mm: setattr(mm, "on_ac", True))
    state, saves = drive(callbacks(tmp_path, m, "balanced", device="cuda"), m, steps=80)
    pause, = events(tmp_path, "battery_pause")
    assert pause["battery_percent"] == 19.0 and pause["step"] in [s for s, _ in saves]
    resume = events(tmp_path, "power_resume")[0]
    assert resume["step"] == pause["step"] and 460 < resume["paused_seconds"] < 480
    assert state.global_step == 80
    assert "nvidia-smi -pl" in events(tmp_path, "power_battery")[0]["reason"]


def test_no_ac_within_the_maximum_wait_stops_cleanly(tmp_path):
    m = Machine(on_ac=False, battery=10.0, heat=0.0)
    with pytest.raises(TrainingStopped) as exc:
        drive(callbacks(tmp_path, m, "extreme", device="cuda"), m, steps=50)
    assert exc.value.exit_code == 4 and "no AC within 60 min" in str(exc.value)
    assert "battery at 10 %" in str(exc.value)
    stop, = events(tmp_path, "battery_stop")
    assert stop["paused_seconds"] >= 3600.0


# ---------------------------------------------------------------------------------------------
# checkpoint cadence
@pytest.mark.parametrize("mode", MODES)
def test_cadence_interval_bounds(mode):
    th = safety_thresholds(mode)
    for cost in (0.01, 0.1, 1.0, 3.0, 8.0, 30.0, 120.0):
        for mtbf in (600.0, th.interruption_seconds, 30 * 24 * 3600.0):
            c = cadence_interval(cost, mtbf, th)
            assert c.interval_seconds <= th.max_loss_seconds  # never more lost work than the mode allows
            if cost / th.overhead_max_share <= th.max_loss_seconds:
                assert c.overhead_share <= th.overhead_max_share + 1e-12
            else:  # both cannot hold: the loss bound wins, the overhead is reported
                assert c.limited_by == "max_loss" and c.overhead_share > th.overhead_max_share
            assert c.interval_seconds >= min(math.sqrt(2 * cost * mtbf), th.max_loss_seconds) - 1e-9


@pytest.mark.parametrize("save_seconds", [0.05, 0.5, 2.0, 8.0])
def test_cadence_keeps_checkpoint_overhead_under_3_percent(tmp_path, save_seconds):
    """A simulated 4-hour run of 2-second steps: measured checkpoint time <= 3 % of the run, and
    never more than the mode's maximum loss of work between two checkpoints."""
    m = Machine(heat=0.0)
    cbs = callbacks(tmp_path, m, "balanced")
    state, saves = drive(cbs, m, steps=7200, step_seconds=2.0, save_seconds=save_seconds)
    assert len(saves) >= 2
    assert len(saves) * save_seconds / m.t <= 0.03
    starts = [0.0] + [t for _, t in saves]
    gaps = [b - a - save_seconds for a, b in zip(starts, starts[1:])]
    assert max(gaps) <= 900.0 + 2.0  # balanced: 15 min, checked at step ends (2 s)
    measured = [e for e in events(tmp_path, "checkpoint_cadence") if e["cost_source"] == "measured"]
    assert measured and measured[0]["checkpoint_seconds"] == pytest.approx(save_seconds)
    assert len(events(tmp_path, "checkpoint_cadence")) <= 3  # logged once, and when it changes


def test_cadence_overhead_above_target_is_said(tmp_path):
    m = Machine(heat=0.0)
    drive(callbacks(tmp_path, m, "extreme"), m, steps=1000, step_seconds=1.0, save_seconds=20.0)
    last = events(tmp_path, "checkpoint_cadence")[-1]
    assert last["limited_by"] == "max_loss" and last["interval_seconds"] == 300.0
    assert "above the 3% target" in last["reason"]


def test_cadence_skips_a_checkpoint_just_before_the_end(tmp_path):
    m = Machine(heat=0.0)
    cbs = callbacks(tmp_path, m, "extreme")
    cadence = next(cb for cb in cbs if isinstance(cb, CadencePolicy))
    cadence.costs = [1.0]  # interval sqrt(2 x 1 x 7200) = 120 s
    _, saves = drive(cbs, m, steps=130, step_seconds=1.0, save_seconds=1.0)
    assert [s for s, _ in saves] == [130]  # at step 120 the end (10 s later) was nearer than the next interval


def test_cadence_estimates_the_first_checkpoint_from_the_model(tmp_path):
    import torch

    model = torch.nn.Linear(1000, 1000)  # ~1M parameters: 4 MB weights + 8 MB optimizer state
    m = Machine(heat=0.0)
    drive(callbacks(tmp_path, m, "balanced"), m, steps=3, model=model)
    first = events(tmp_path, "checkpoint_cadence")[0]
    assert first["cost_source"] == "estimated"
    assert first["checkpoint_seconds"] == pytest.approx(0.1 + 1_001_000 * 12 / 200e6, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# signals
def test_signal_handlers_installed_restored_and_second_signal_aborts(tmp_path):
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    ctx = SafetyContext(thresholds=safety_thresholds(None), run_dir=tmp_path)
    policy = SignalPolicy(ctx)
    policy.install()
    try:
        assert signal.getsignal(signal.SIGINT) == policy._handle
        os.kill(os.getpid(), signal.SIGTERM)  # the first one only asks for a stop
        time.sleep(0.01)
        assert ctx.signal_received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            policy._handle(signal.SIGINT, None)  # the second aborts at once...
        assert signal.getsignal(signal.SIGINT) is before_int  # ...and gives the handlers back
        assert signal.getsignal(signal.SIGTERM) is before_term
    finally:
        policy.restore()
    ctx.signal_received = None
    policy.install()
    policy._handle(signal.SIGTERM, None)
    with pytest.raises(SystemExit) as exc:
        policy._handle(signal.SIGTERM, None)
    assert exc.value.code == 143
    policy.restore()


def test_signal_during_a_pause_ends_it_and_stops_after_a_checkpoint(tmp_path):
    m = Machine(temp=95.0, heat=0.0, cool=0.0)
    before = signal.getsignal(signal.SIGINT)  # whatever the test run had installed
    cbs = safety_callbacks("extreme", m.sample, run_dir=tmp_path, device="cuda", clock=m.clock, sleep=m.sleep,
                           world_size=1, rank=0)  # signal handlers installed, restored at the end
    ctx = context_of(cbs)
    m.at(200.0, lambda mm: setattr(ctx, "signal_received", signal.SIGINT))
    with pytest.raises(TrainingStopped) as exc:
        drive(cbs, m, steps=50)
    assert exc.value.exit_code == 130 and exc.value.step == 1  # checkpoint-1 was written before the pause
    assert events(tmp_path, "signal")[0]["step"] == 1
    assert signal.getsignal(signal.SIGINT) is before


ENTRY = textwrap.dedent("""
    # `trainfit train` (whose runner adds the safety callbacks) plus a callback that holds step 3
    # until the signal arrives, so that the signal lands mid-run.
    import signal, sys, time
    from transformers import TrainerCallback
    import trainfit.train.runner as runner
    from trainfit.cli.main import main

    ready, argv = sys.argv[1], sys.argv[2:]
    real = runner.run_training

    def received():
        # the SignalPolicy the runner installed: its handler is a bound method of the policy
        ctx = getattr(getattr(signal.getsignal(signal.SIGINT), "__self__", None), "ctx", None)
        return ctx is not None and ctx.signal_received is not None

    class Hold(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                open(ready, "w").close()
                start = time.monotonic()
                while not received() and time.monotonic() - start < 60:
                    time.sleep(0.01)

    def with_hold(cfg, run_dir, **kw):
        kw["extra_callbacks"] = [Hold()]
        return real(cfg, run_dir, **kw)

    runner.run_training = with_hold
    sys.exit(main(argv))
""")


@pytest.mark.slow
def test_sigint_and_sigterm_checkpoint_exit_cleanly_and_resume_exactly(tmp_path):
    from trainfit.cli.main import main
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    config = make_config(tmp_path, "pretrain")  # 12 steps, checkpoints every 4
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    procs = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        run_dir, ready = tmp_path / sig.name, tmp_path / f"{sig.name}.ready"
        procs[sig] = (subprocess.Popen([sys.executable, str(entry), str(ready), "train", str(config), "--out",
                                        str(run_dir), "--quiet"], cwd=str(REPO), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True), run_dir, ready)
    reference = run_training(load_run_config(config), tmp_path / "full", quiet=True)  # meanwhile
    for sig, (proc, run_dir, ready) in procs.items():
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate()[1][-3000:]
        proc.send_signal(sig)
    for sig, (proc, run_dir, ready) in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, err[-3000:]
        assert f"stopped at step 3 of 12: {sig.name} received" in err and "--resume" in err
        assert ck.inspect_checkpoint(run_dir / "checkpoints" / "checkpoint-3").complete
        assert not (run_dir / "summary.json").exists() and not (run_dir / "final").exists()
        rec, = events(run_dir, "signal")
        assert rec["step"] == 3 and rec["exit_code"] == 128 + sig
    # an interrupted write left behind is cleaned when the run starts again
    run_dir = procs[signal.SIGINT][1]
    staging = run_dir / "checkpoints" / ".staging-checkpoint-4-deadbeef" / "checkpoint-4"
    staging.mkdir(parents=True)
    (staging / "model.safetensors").write_bytes(b"half")
    assert main(["train", str(config), "--out", str(run_dir), "--resume", "--quiet"]) == 0
    assert loss_trajectory(run_dir) == dict(reference.losses)
    assert not list((run_dir / "checkpoints").glob(".staging-*"))
    resumed = run_training(load_run_config(config), procs[signal.SIGTERM][1], resume=True, quiet=True)
    assert resumed.resumed_from.endswith("checkpoint-3")
    assert loss_trajectory(procs[signal.SIGTERM][1]) == dict(reference.losses)


# ---------------------------------------------------------------------------------------------
# cleanup of interrupted writes
def test_leftovers_of_interrupted_writes_are_removed(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    keep = ckpt_dir / "checkpoint-6"
    keep.mkdir(parents=True)
    (keep / "a.bin").write_bytes(b"abc")
    ck.seal(keep)
    aside = ckpt_dir / "checkpoint-4.corrupt-1"
    aside.mkdir()
    full = ckpt_dir / ".staging-checkpoint-8-aa" / "checkpoint-8"
    full.mkdir(parents=True)
    (full / "optimizer.pt").write_bytes(b"x" * 100)
    (ckpt_dir / ".staging-checkpoint-10-bb").mkdir()
    trash = ckpt_dir / ".checkpoint-2.trash-cc"
    trash.mkdir()
    (trash / "model.safetensors").write_bytes(b"y")
    removed = sorted(p.name for p in ck.clean_leftovers(ckpt_dir))
    assert removed == [".checkpoint-2.trash-cc", ".staging-checkpoint-10-bb", ".staging-checkpoint-8-aa"]
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["checkpoint-4.corrupt-1", "checkpoint-6"]
    assert ck.inspect_checkpoint(keep).complete


def test_thermal_policy_assess_is_pure_on_the_reading():
    ctx = SafetyContext(thresholds=safety_thresholds("conservative"), device="cuda")
    policy = ThermalPolicy(ctx)
    hot = Sample(0.0, HostSample(), (GpuSample(0, temperature_c=80.0, slowdown_temperature_c=90.0),))
    cool = Sample(0.0, HostSample(), (GpuSample(0, temperature_c=69.0, slowdown_temperature_c=90.0),))
    warm = Sample(0.0, HostSample(), (GpuSample(0, temperature_c=75.0, slowdown_temperature_c=90.0),))
    assert policy.assess(hot, 0.0) is not None  # conservative: within 10 C of 90
    assert policy.assess(warm, 0.0) is None
    assert policy.assess(warm, 0.0, cooling=True) is not None  # not cool enough to resume (< 70 C)
    assert policy.assess(cool, 0.0, cooling=True) is None
    ctx.gpu_indices = (1,)
    assert policy.assess(hot, 0.0) is None  # another GPU's heat does not count


def test_safety_mode_in_the_run_config(tmp_path):
    from trainfit.errors import BadInputError
    from trainfit.config.run_config import load_run_config

    plain = load_run_config(make_config(tmp_path, "pretrain"))
    extreme = load_run_config(make_config(tmp_path, "pretrain", name="x.yaml", safety={"mode": "extreme"}))
    assert plain.safety.mode == "balanced" and extreme.safety.mode == "extreme"
    assert plain.config_hash() == extreme.config_hash()  # a resumed run may change its safety mode
    with pytest.raises(BadInputError) as exc:
        load_run_config(make_config(tmp_path, "pretrain", name="y.yaml", safety={"mode": "reckless"}))
    assert "safety.mode" in str(exc.value) and "conservative" in str(exc.value)


# ---------------------------------------------------------------------------------------------
# memory pressure reads only the monitor's new events
def test_memory_pressure_reads_each_monitor_event_once():
    from trainfit.hardware.sample_fakes import FakeSampler
    from trainfit.train.monitor.live import Monitor
    from trainfit.train.monitor.machine_policies import MemoryPressurePolicy

    mon = Monitor(None, interval_seconds=60, sampler=FakeSampler(host={}))
    read = []

    def events_since(seen):
        records, count = mon.events_since(seen)
        read.append(len(records))
        return records, count

    asked = []
    policy = MemoryPressurePolicy(SafetyContext(thresholds=safety_thresholds("balanced"), device="cpu"),
                                  request=lambda reason: asked.append(reason) or True, leak_events=events_since)
    state = SimpleNamespace(global_step=0, max_steps=10_000)
    for step in range(1, 301):  # a long run: 150 unrelated events, more than the monitor keeps (100)
        state.global_step = step
        if step % 2:
            mon.emit("checkpoint_cadence", f"event {step}")
        if step == 251:  # beside that step's other event: two new records
            mon.emit("memory_leak", "leak", mib_per_step=64.0, steps_to_full=100)
        policy.on_step_end(None, state, None)
    assert max(read) == 2 and sum(read) == 151  # each record read once, however many were emitted before
    assert len(asked) == 1 and "memory leak of 64 MiB per step" in asked[0]
    records, count = mon.events_since(0)
    assert count == 151 and len(records) == 100  # from further back than it keeps: the ones it has
